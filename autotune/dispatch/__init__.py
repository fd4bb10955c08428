"""Dispatchers: where and when the controller's trials run (see `Dispatcher` for the contract).

The implementations load on first use, so importing this package pulls in neither Ray nor a backend.
"""

from autotune.dispatch._base import Dispatcher, TrialEvent

__all__ = ["Dispatcher", "DryRunDispatcher", "InProcessDispatcher", "RayDispatcher", "TrialEvent"]

_LAZY = {"RayDispatcher": "_ray", "InProcessDispatcher": "_inprocess", "DryRunDispatcher": "_dryrun"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"autotune.dispatch.{_LAZY[name]}"), name)
    raise AttributeError(name)
