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

from autotune._numbers import parse_int
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

# Performance knobs (issue 16). None means "the recipe's own value" (declared per model in the
# `perf_knobs` section of search_spaces/<model>.yaml, first value); a layout sets one only to differ.
# How each maps to Megatron-Bridge fields: megatron/overrides.py; the rules among them: space/legality.py.
PERF_CHOICES: dict[str, tuple[str, ...]] = {
    # token dispatcher and, for flex, its backend (one knob: a backend exists only under flex)
    "dispatcher": ("alltoall", "flex_deepep", "flex_hybridep"),
    # CUDA graphs: none; Transformer Engine graphs of a scope (te_<modules>); the whole iteration
    "cuda_graph": ("none", "te_router", "te_attn_router", "te_attn", "te_attn_mlp", "full_iteration"),
    "cp_comm_type": ("p2p", "a2a", "all_gather"),
}
PERF_BOOL_KNOBS = ("ep_overlap", "shared_expert_overlap", "tp_comm_overlap", "overlap_grad_reduce",
                   "overlap_param_gather")
PERF_INT_KNOBS = ("dispatcher_sms", "cpu_offload_layers")
# SMs of the flex dispatcher (no GPU has more than 256); layers offloaded (no model has 10,000)
PERF_INT_RANGES = {"dispatcher_sms": (1, 256), "cpu_offload_layers": (0, 10_000)}
# modules of selective recompute, in Megatron-Core's order; a value is a '+'-joined subset
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts", "mla_up_proj")
PERF_KNOBS = ("dispatcher", "dispatcher_sms", "ep_overlap", "shared_expert_overlap", "cuda_graph", "recompute_modules",
              "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "cp_comm_type", "cpu_offload_layers")
ALL_KNOBS = KNOBS + PERF_KNOBS


@dataclass(frozen=True)
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
    # performance knobs: None = the recipe's value (see PERF_KNOBS)
    dispatcher: str | None = None
    dispatcher_sms: int | None = None
    ep_overlap: bool | None = None
    shared_expert_overlap: bool | None = None
    cuda_graph: str | None = None
    recompute_modules: str | None = None
    tp_comm_overlap: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    cp_comm_type: str | None = None
    cpu_offload_layers: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "LayoutConfig":
        """Build from a JSON-like mapping, checking every key and value (ConfigError otherwise)."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a config must be a JSON object, got {type(values).__name__}")
        unknown = sorted(set(values) - set(ALL_KNOBS))
        if unknown:
            raise ConfigError(f"unknown knob {unknown[0]!r} (knobs: {', '.join(ALL_KNOBS)})")
        return cls(**{name: coerce_knob(name, value) for name, value in values.items()})

    def to_dict(self) -> dict[str, Any]:
        """Every layout knob, and the performance knobs this layout sets (a knob left at the recipe's
        value is absent, so layouts stored before performance knobs existed keep their keys)."""
        # every field is a scalar: a plain read, not dataclasses.asdict's recursive deep copy (which
        # made keying the ~190k legal layouts of a 64-GPU study take seconds)
        values = {name: getattr(self, name) for name in _LAYOUT_FIELDS}
        for name in PERF_KNOBS:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        return values

    def perf(self) -> dict[str, Any]:
        """The performance knobs this layout sets (the others take the recipe's value)."""
        return {name: getattr(self, name) for name in PERF_KNOBS if getattr(self, name) is not None}

    def layout_only(self) -> "LayoutConfig":
        """The same parallel layout with every performance knob at the recipe's value."""
        return self.replace(**{name: None for name in PERF_KNOBS}) if self.perf() else self

    def __lt__(self, other: "LayoutConfig") -> bool:  # a stable order for sorted(); None sorts first
        return _sort_key(self) < _sort_key(other)

    def key(self) -> str:
        """Canonical text of the layout: equal layouts have equal keys (used for de-duplication).

        Exactly `json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))` (stored keys depend
        on it), written out field by field: a study keys every legal layout at its start (~180,000 at 64
        GPUs), and the general encoder took 1.5x as long."""
        parts = []
        for name, perf, head in _KEY_FIELDS:
            value = getattr(self, name)
            if value is None and perf:  # a performance knob at the recipe's value is not in to_dict()
                continue
            parts.append(head + _json_scalar(value))
        return "{" + ",".join(parts) + "}"

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
        parts.extend(f"{PERF_LABELS[name]}={_perf_text(value)}" for name, value in self.perf().items())
        return " ".join(parts)


# short labels of the performance knobs in `LayoutConfig.short()` (the legends say what they mean)
PERF_LABELS = {"dispatcher": "disp", "dispatcher_sms": "sms", "ep_overlap": "epov", "shared_expert_overlap": "seov",
               "cuda_graph": "cg", "recompute_modules": "rcm", "tp_comm_overlap": "tpov", "overlap_grad_reduce": "gov",
               "overlap_param_gather": "pov", "cp_comm_type": "cpc", "cpu_offload_layers": "off"}


def _perf_text(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _sort_key(config: "LayoutConfig") -> tuple:
    return tuple((getattr(config, n) is not None, getattr(config, n) if getattr(config, n) is not None else 0)
                 for n in _FIELD_NAMES)



_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(LayoutConfig))
_LAYOUT_FIELDS = tuple(name for name in _FIELD_NAMES if name in KNOBS)  # the layout knobs, in field order
# LayoutConfig.key's fields in sorted order: (name, is a performance knob, its JSON member head)
_KEY_FIELDS = tuple((name, name in PERF_KNOBS, json.dumps(name) + ":")
                    for name in sorted(_LAYOUT_FIELDS + PERF_KNOBS))


def _json_scalar(value: Any) -> str:
    """`json.dumps(value)` for the scalars a knob holds, without the general encoder's set-up."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return json.encoder.encode_basestring_ascii(value)
    # anything else (a float, an int subclass, a container a record of another version might hold): the encoder
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def coerce_knob(name: str, value: Any) -> Any:
    """Return `value` as the type knob `name` takes; accept the strings a command line gives."""
    if name in PERF_KNOBS:
        return _coerce_perf(name, value)
    if name not in KNOBS:
        raise ConfigError(f"unknown knob {name!r} (knobs: {', '.join(ALL_KNOBS)})")
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


def _coerce_perf(name: str, value: Any) -> Any:
    """A performance knob's value; None (or "recipe") keeps the recipe's own value."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("recipe", "null", "")):
        return None
    if name in PERF_BOOL_KNOBS:
        return _as_bool(name, value)
    if name in PERF_INT_KNOBS:
        number = _as_int(name, value)
        low, high = PERF_INT_RANGES[name]
        if not low <= number <= high:
            raise ConfigError(f"knob {name} must be between {low} and {high}, got {str(number)[:40]}")
        return number
    text = str(value).strip().lower()
    if name == "recompute_modules":
        modules = [m.strip() for m in text.replace(",", "+").split("+") if m.strip()]
        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown or not modules:
            raise ConfigError(f"knob recompute_modules takes '+'-joined modules of {', '.join(RECOMPUTE_MODULES)}, "
                              f"got {value!r}")
        return "+".join(m for m in RECOMPUTE_MODULES if m in modules)  # one spelling per set
    if text not in PERF_CHOICES[name]:
        raise ConfigError(f"knob {name} must be one of {', '.join(PERF_CHOICES[name])}, got {value!r}")
    return text


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"knob {name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return parse_int(value)  # ASCII digits: not ２, not 1_6
        except ValueError:
            pass
    raise ConfigError(f"knob {name} must be an integer, got {value!r}")


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")  # review: sp=yes worked, sp=off did not
    raise ConfigError(f"knob {name} must be true or false (or yes/no, on/off, 1/0), got {value!r}")


# The largest GPU count, global batch size or sequence length a workload may have (a billion): no cluster
# or recipe comes near it, and beyond it the cost model's sums lose their meaning (10**400 overflows them).
MAX_WORKLOAD_COUNT = 10**9
MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers take 32-bit seeds
MAX_BUDGET = 10**6  # runs of one study: the budget is an INTEGER column; far beyond any real study
MAX_GPU_HOURS = 1e9  # a study's --max-gpu-hours: far beyond any real cluster's year


# A cluster's own scale-out bandwidth per GPU, GB/s: at most four times a GB300 GPU's 800 Gb/s NIC, at
# least 1 Gb/s Ethernet (below it no training job spans nodes); outside, a typo (Gb/s written for GB/s)
MIN_NETWORK_GBPS, MAX_NETWORK_GBPS = 0.1, 400.0


def is_network_gbps(value: Any) -> bool:
    """A scale-out bandwidth per GPU a cluster can have (GB/s, finite, within the bounds above)."""
    from autotune._numbers import is_finite_number

    return is_finite_number(value) and MIN_NETWORK_GBPS <= value <= MAX_NETWORK_GBPS


@dataclass(frozen=True)
class Cluster:
    """GPUs available to one trial: `gpus` in nodes of `gpus_per_node`, all of type `gpu`."""

    gpus: int
    gpus_per_node: int
    gpu: "GpuType"
    # scale-out (InfiniBand / RoCE) bandwidth per GPU, GB/s one direction, when the cluster's differs
    # from the GPU type's DGX figure (e.g. four NICs per eight-GPU node); None keeps the GPU type's
    network_gbps: float | None = None

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def scale_out_gbps(self) -> float:
        """Scale-out bandwidth per GPU, GB/s one direction: the cluster's own figure or the GPU type's."""
        return self.gpu.network_gbps if self.network_gbps is None else self.network_gbps

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs that talk over NVLink: the node, or the whole NVL72 rack on GB200/GB300."""
        if self.gpu.nvlink_domain_gpus > self.gpu.default_gpus_per_node:
            return self.gpu.nvlink_domain_gpus
        return self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "gpu": self.gpu.name}
        if self.network_gbps is not None:  # only when the cluster has its own: older records lack the key
            out["network_gbps"] = self.network_gbps
        return out


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
