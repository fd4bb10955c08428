"""autotune: automated sweeps and autotuning of Megatron-Bridge parallel layouts.

Importing autotune imports no ray, torch, megatron or web framework (house rule 6): those load
lazily where they are used, so `autotune --help` and the planning commands stay instant.
"""

__version__ = "0.1.0"
