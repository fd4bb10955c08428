"""The objects every part of autotune speaks in: a layout (the knobs) and a workload.

A `LayoutConfig` is one point of the search space: the parallel layout plus micro-batch,
recompute and distributed optimizer. A `Workload` is what the layout is for: a model on a
cluster with a global batch, a sequence length and a precision.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.catalog import GpuType, ModelSpec

RECOMPUTE_CHOICES = ("none", "selective", "full")
# how much memory each recompute choice saves, in order (the cost model's arrays and the OOM frontier)
RECOMPUTE_CODES = {choice: code for code, choice in enumerate(RECOMPUTE_CHOICES)}
RECOMPUTE_METHODS = ("uniform", "block")
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")

# Integer knobs (>= 1), boolean knobs, and the others with their neutral value.
INT_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs")
BOOL_KNOBS = ("sp", "dist_opt")
KNOBS = INT_KNOBS + BOOL_KNOBS + ("recompute", "recompute_method", "recompute_num_layers")


@dataclass(frozen=True, order=True)
class LayoutConfig:
    """One candidate layout. `vpp` 1 means no interleaving; missing knobs take the neutral value."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False
    mbs: int = 1
    recompute: str = "none"
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    dist_opt: bool = False

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "LayoutConfig":
        """Build from a JSON-like mapping, checking every key and value (ConfigError otherwise)."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a config must be a JSON object, got {type(values).__name__}")
        unknown = sorted(set(values) - set(KNOBS))
        if unknown:
            raise ConfigError(f"unknown knob {unknown[0]!r} (knobs: {', '.join(KNOBS)})")
        return cls(**{name: coerce_knob(name, value) for name, value in values.items()})

    def to_dict(self) -> dict[str, Any]:
        # every field is a scalar: a plain read, not dataclasses.asdict's recursive deep copy (which
        # made keying the ~190k legal layouts of a 64-GPU study take seconds)
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def key(self) -> str:
        """Canonical text of the layout: equal layouts have equal keys (used for de-duplication)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> "LayoutConfig":
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        """A compact human label such as `TP2 PP4 VPP2 EP8 SP MBS1 rc=sel DO`."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp > 1:
            parts.append(f"ETP{self.etp}")
        if self.sp:
            parts.append("SP")
        parts.append(f"MBS{self.mbs}")
        if self.recompute == "selective":
            parts.append("rc=sel")
        elif self.recompute == "full":
            parts.append(f"rc=full/{self.recompute_method}/{self.recompute_num_layers}")
        if self.dist_opt:
            parts.append("DO")
        return " ".join(parts)



_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(LayoutConfig))

def coerce_knob(name: str, value: Any) -> Any:
    """Return `value` as the type knob `name` takes; accept the strings a command line gives."""
    if name not in KNOBS:
        raise ConfigError(f"unknown knob {name!r} (knobs: {', '.join(KNOBS)})")
    if name in INT_KNOBS or name == "recompute_num_layers":
        if value is None and name == "recompute_num_layers":
            return None
        number = _as_int(name, value)
        if number < 1:
            raise ConfigError(f"knob {name} must be >= 1, got {number}")
        return number
    if name in BOOL_KNOBS:
        return _as_bool(name, value)
    if name == "recompute":
        text = "none" if value is None else str(value).lower()
        if text not in RECOMPUTE_CHOICES:
            raise ConfigError(f"knob recompute must be one of {', '.join(RECOMPUTE_CHOICES)}, got {value!r}")
        return text
    # recompute_method
    if value is None or str(value).lower() in ("none", "null"):
        return None
    if str(value).lower() not in RECOMPUTE_METHODS:
        raise ConfigError(f"knob recompute_method must be uniform or block, got {value!r}")
    return str(value).lower()


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"knob {name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigError(f"knob {name} must be an integer, got {value!r}")


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ConfigError(f"knob {name} must be true or false, got {value!r}")


@dataclass(frozen=True)
class Cluster:
    """GPUs available to one trial: `gpus` in nodes of `gpus_per_node`, all of type `gpu`."""

    gpus: int
    gpus_per_node: int
    gpu: "GpuType"

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs that talk over NVLink: the node, or the whole NVL72 rack on GB200/GB300."""
        if self.gpu.nvlink_domain_gpus > self.gpu.default_gpus_per_node:
            return self.gpu.nvlink_domain_gpus
        return self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "gpu": self.gpu.name}


@dataclass(frozen=True)
class Workload:
    """What a layout is tuned for: a model on a cluster, with batch, sequence length and precision."""

    model: "ModelSpec"
    cluster: Cluster
    global_batch_size: int
    seq_length: int
    precision: str = "bf16"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            **self.cluster.to_dict(),
            "global_batch_size": self.global_batch_size,
            "seq_length": self.seq_length,
            "precision": self.precision,
        }
