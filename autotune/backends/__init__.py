"""Backends that run trials, behind one protocol (see `base`). Imported lazily by name."""

from __future__ import annotations

import importlib
from typing import Any

from autotune.backends.base import (PROTOCOL_VERSION, Backend, ResourceRequest, StepReport, TrialOutcome, TrialSpec,
                                    TrialStatus)
from autotune.errors import ConfigError

# name -> "module:Class"; heavy backends (megatron) import their dependencies only when created.
REGISTRY = {
    "simulate": "autotune.backends.simulate:SimulateBackend",
    "command": "autotune.backends.command:CommandBackend",
    "replay": "autotune.backends.replay:ReplayBackend",
    "megatron": "autotune.backends.megatron:MegatronBackend",
}


def backend_class(name: str) -> type[Backend]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r} (known: {', '.join(REGISTRY)})") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def create_backend(name: str, options: dict[str, Any] | None = None) -> Backend:
    return backend_class(name)(options)


__all__ = ["Backend", "PROTOCOL_VERSION", "REGISTRY", "ResourceRequest", "StepReport", "TrialOutcome", "TrialSpec",
           "TrialStatus", "backend_class", "create_backend"]
