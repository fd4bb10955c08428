"""Performance knobs (issue 16): what each one is on a layout (no legality here: rules import this).

A layout leaves a performance knob at None to keep the recipe's value (`ModelSpec.perf_defaults`,
from the `perf_knobs` section of the model's YAML). `effective` says what Megatron-Bridge then runs:
the recipe's value, adjusted where the layout makes it a no-op or illegal exactly as the emitted
overrides do (full recompute turns the recipe's scoped CUDA graphs off; TP overlap is off without
TP >= 2 and sequence parallelism; the DP overlaps are off without the distributed optimizer or DP > 1).
`exists` is each knob's parent condition (the legal settings of a layout: `space.perf.variants`).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from autotune.config import Workload

# CUDA graph choices -> (Megatron-Core cuda_graph_impl, cuda_graph_scope modules)
CUDA_GRAPHS: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("none", ()),
    "te_router": ("transformer_engine", ("moe_router", "moe_preprocess")),
    "te_attn_router": ("transformer_engine", ("attn", "moe_router", "moe_preprocess")),
    "te_attn": ("transformer_engine", ("attn",)),
    "te_attn_mlp": ("transformer_engine", ("attn", "mlp")),
    "full_iteration": ("full_iteration", ()),
}


def data_parallel(c: Mapping[str, Any], w: Workload) -> int:
    return w.cluster.gpus // (c["tp"] * c["pp"] * c["cp"])


def effective(c: Mapping[str, Any], w: Workload) -> dict[str, Any]:
    """Every performance knob the model declares, as the run will have it (see the module docstring)."""
    defaults = w.model.perf_defaults
    out: dict[str, Any] = {}
    for name, default in defaults.items():
        value = c.get(name)
        out[name] = default if value is None else value
        if value is not None:
            continue
        if name == "cuda_graph" and c["recompute"] == "full" and default.startswith("te_"):
            out[name] = "none"  # what overrides.layout_fields emits: Megatron refuses TE graphs with full recompute
        elif name == "tp_comm_overlap":
            out[name] = bool(default) and c["tp"] >= 2 and bool(c["sp"])
        elif name in ("overlap_grad_reduce", "overlap_param_gather"):
            out[name] = bool(default) and bool(c["dist_opt"]) and data_parallel(c, w) > 1
        elif name == "recompute_modules":
            out[name] = default if c["recompute"] == "selective" else None
        elif name == "cp_comm_type":
            out[name] = default if c["cp"] > 1 else None
        elif name == "dispatcher_sms":
            out[name] = default if str(out.get("dispatcher", defaults.get("dispatcher", ""))).startswith("flex") else None
    return out


def exists(name: str, c: Mapping[str, Any], w: Workload) -> bool:
    """Whether knob `name` means anything for layout `c` (its parent condition), recipe values assumed."""
    a = w.model.architecture
    e = effective(c, w)
    if name in ("dispatcher", "ep_overlap"):
        return a.is_moe and (name == "dispatcher" or c["ep"] > 1)
    if name == "dispatcher_sms":
        return a.is_moe and str(e.get("dispatcher", "")).startswith("flex")
    if name == "shared_expert_overlap":
        return a.is_moe and a.moe_shared_expert_ffn_hidden_size > 0
    if name == "recompute_modules":
        return c["recompute"] == "selective"
    if name == "tp_comm_overlap":
        return c["tp"] >= 2 and bool(c["sp"])
    if name in ("overlap_grad_reduce", "overlap_param_gather"):
        return bool(c["dist_opt"]) and data_parallel(c, w) > 1
    if name == "cp_comm_type":
        return c["cp"] > 1
    if name == "cpu_offload_layers":
        return c["pp"] == 1 and c["recompute"] == "none"
    return True  # cuda_graph


