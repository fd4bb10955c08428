"""What each performance knob changes (issue 16), relative to the recipe's own value.

The cost model's constants were calibrated on recipes that run with their own knob values (Qwen3's
HybridEP dispatcher and router CUDA graphs, DeepSeek-V3's HybridEP without graphs, ...). A knob left at
the recipe's value therefore changes nothing; a knob set to another value rescales the step-time term
it acts on by the ratio of the two values' effects, and the memory term likewise:

  dispatcher      EP term: a flex dispatcher (DeepEP / HybridEP) sends a token once per destination
                  node; NCCL all-to-all sends every expert copy, at NCCL's all-to-all efficiency.
  dispatcher_sms  EP term: a flex dispatcher's bandwidth grows slowly with its SMs.
  ep_overlap      EP term: the 1F1B all-to-all overlap hides a share of the exposed dispatch/combine
                  (EP_OVERLAP_HIDDEN, fitted to the one published A/B: Bridge's moe-comm-overlap skill
                  card, Qwen3-30B-A3B on 16 H100, step -15.06%).
  cuda_graph      overhead term: the per-layer launch overhead left ungraphed (UNGRAPHED_SHARE).
  recompute_modules  recompute term and activations: each module's share of a layer's forward compute
                  and of its saved activations (RECOMPUTE_MODULE; engineering estimates, ordered as the
                  activation-recompute skill card measured them on Moonlight-16B).
  tp_comm_overlap TP term: the exposed share with and without Transformer Engine's overlap.
  overlap_grad_reduce / overlap_param_gather  DP term: without overlap the whole collective is exposed.
  cp_comm_type    CP term: relative cost of p2p (ring), a2a and all-gather context parallelism.
  cpu_offload_layers  activations of the offloaded layers leave the GPU; their PCIe traffic is
                  partly exposed.
Nothing here is fitted per model; EP_OVERLAP_HIDDEN is the only constant fitted to a measurement.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from autotune.config import LayoutConfig, Workload
from autotune.cost import calibration as cal

if TYPE_CHECKING:
    from autotune.cost import Estimate

# NCCL's all-to-all across nodes reaches less of the NIC than DeepEP / HybridEP's kernels
# (ALLTOALL_NETWORK_EFFICIENCY), and it moves one copy per routed expert, not per node.
NCCL_ALLTOALL_NETWORK_EFFICIENCY = 0.6
DEEPEP_RELATIVE_EFFICIENCY = 0.95  # DeepEP normal kernels vs HybridEP on H100 (no matched A/B: a guess)
FLEX_SMS_EXPONENT = 0.25  # bandwidth ~ SMs^0.25 around the recipe's SM count
# Share of the exposed EP dispatch/combine hidden by overlap_moe_expert_parallel_comm: fitted to the
# skill card's A/B (step 24.714 -> 20.992 s, -15.06%) on the recipe layout; tests/cost/test_knobs.py.
EP_OVERLAP_HIDDEN = 0.93
# Per-layer launch overhead left ungraphed by each CUDA graph choice.
UNGRAPHED_SHARE = {"none": 1.0, "te_router": 0.7, "te_attn": 0.7, "te_attn_router": 0.4, "te_attn_mlp": 0.4,
                   "full_iteration": 0.15}
# module -> (share of a layer's forward compute recomputed, share of a layer's saved activations freed)
RECOMPUTE_MODULE = {"core_attn": (0.0, 0.0),  # the cost model's `selective` already is core_attn
                    "moe_act": (0.02, 0.12), "layernorm": (0.04, 0.08), "mla_up_proj": (0.05, 0.10),
                    "mlp": (0.25, 0.25), "shared_experts": (0.08, 0.10), "moe": (0.55, 0.45)}
EXPOSED_TP_WITHOUT_OVERLAP = 0.8  # vs calibration.EXPOSED_TP_WITH_SP with Transformer Engine's overlap
CP_COMM_COST = {"p2p": 1.0, "a2a": 0.8, "all_gather": 1.3}
PCIE_GBPS = 25.0  # host <-> GPU, per GPU, achieved
EXPOSED_OFFLOAD = 0.3  # offload copies run on their own stream, mostly hidden behind the next layers


def applies(layout: LayoutConfig) -> bool:
    return bool(layout.perf())


def adjust(workload: Workload, layout: LayoutConfig, base: Estimate) -> Estimate:
    """The estimate of `layout` with its performance knobs, from `base`, the estimate of the same
    layout with the recipe's values (see the module docstring)."""
    from autotune.space.perf_values import effective

    model = workload.model
    mine = effective(layout.to_dict(), workload)
    recipe = effective(layout.layout_only().to_dict(), workload)
    b = dict(base.breakdown)
    memory = dict(base.memory)
    a = model.architecture

    if a.is_moe and b.get("ep", 0.0) > 0:
        ratio = _dispatch_cost(mine, workload, layout) / _dispatch_cost(recipe, workload, layout)
        ratio *= _overlap_left(mine) / _overlap_left(recipe)
        b["ep"] *= ratio
    if "cuda_graph" in mine:
        launch = _launch_overhead_s(workload, layout)
        left = UNGRAPHED_SHARE[mine["cuda_graph"]] - UNGRAPHED_SHARE[recipe["cuda_graph"]]
        b["overhead"] = max(0.0, b["overhead"] + launch * left / UNGRAPHED_SHARE[recipe["cuda_graph"]])
    if layout.recompute == "selective" and mine.get("recompute_modules") != recipe.get("recompute_modules"):
        compute_share, freed = _modules(mine["recompute_modules"])
        compute_was, freed_was = _modules(recipe["recompute_modules"])
        forward = b["compute"] / 3
        b["recompute"] = max(0.0, b["recompute"] + forward * (compute_share - compute_was))
        memory["activations_gib"] *= (1 - freed) / (1 - freed_was)
    if mine.get("tp_comm_overlap") != recipe.get("tp_comm_overlap") and layout.tp >= 2 and layout.sp:
        on, off = cal.EXPOSED_TP_WITH_SP, EXPOSED_TP_WITHOUT_OVERLAP
        b["tp"] *= (on / off) if mine["tp_comm_overlap"] else (off / on)
    for knob in ("overlap_grad_reduce", "overlap_param_gather"):
        if mine.get(knob) != recipe.get(knob) and b.get("dp", 0.0) > 0:
            # each overlap hides about half of the DP traffic (reduce-scatter / all-gather); without it that
            # half is exposed in full: bounded by the exposed share calibration assumes at least
            exposed_with = b["dp"] / 2
            exposed_without = exposed_with / max(cal.EXPOSED_DP_MIN, 0.25)
            b["dp"] += (exposed_with - exposed_without) if mine[knob] else (exposed_without - exposed_with)
            b["dp"] = max(0.0, b["dp"])
    if layout.cp > 1 and mine.get("cp_comm_type") != recipe.get("cp_comm_type"):
        b["cp"] *= CP_COMM_COST[mine["cp_comm_type"]] / CP_COMM_COST[recipe["cp_comm_type"] or "p2p"]
    offloaded = (mine.get("cpu_offload_layers") or 0) - (recipe.get("cpu_offload_layers") or 0)
    if offloaded:
        per_layer_gib = memory["activations_gib"] / max(1, a.num_layers // layout.pp)
        memory["activations_gib"] = max(0.0, memory["activations_gib"] - offloaded * per_layer_gib)
        microbatches = workload.global_batch_size / max(1, layout.mbs * _dp(workload, layout))
        traffic_s = 2 * offloaded * per_layer_gib * 2**30 / (PCIE_GBPS * 1e9) * microbatches / max(1, layout.vpp)
        b["overhead"] += EXPOSED_OFFLOAD * traffic_s

    busy = sum(v for k, v in b.items() if k not in ("bubble", "dp", "optimizer"))
    old_busy = sum(v for k, v in base.breakdown.items() if k not in ("bubble", "dp", "optimizer"))
    if old_busy > 0:
        b["bubble"] = base.breakdown.get("bubble", 0.0) * busy / old_busy  # the bubble is a share of busy time
    step = sum(b.values())
    scale = base.step_time_s / step
    peak = sum(memory.values())
    return dataclasses.replace(
        base, step_time_s=step, tokens_per_s_per_gpu=base.tokens_per_s_per_gpu * scale,
        tflops_per_gpu=base.tflops_per_gpu * scale, mfu=base.mfu * scale, peak_mem_gib=peak,
        fits=peak <= base.memory_limit_gib, memory=memory, breakdown=b)


def _dp(w: Workload, layout: LayoutConfig) -> int:
    return max(1, w.cluster.gpus // (layout.tp * layout.pp * layout.cp))


def _dispatch_cost(e: dict, w: Workload, layout: LayoutConfig) -> float:
    """Relative seconds of one dispatch under dispatcher settings `e` (the flex formula of
    step_time._dispatch_s, and NCCL all-to-all's per-expert copies at its own efficiency)."""
    a, gpu = w.model.architecture, w.cluster.gpu
    span, domain = layout.ep * layout.etp, float(w.cluster.nvlink_domain_gpus)
    inside = min(1.0, domain / span)
    k = a.moe_router_topk
    copies_inside = k * inside * (layout.ep - 1) / layout.ep
    dispatcher = e.get("dispatcher") or "flex_hybridep"
    if dispatcher == "alltoall":
        copies_outside, network = k * (1 - inside), NCCL_ALLTOALL_NETWORK_EFFICIENCY
    else:
        other_nodes = max(0.0, math.ceil(span / domain) - 1)
        copies_outside = min(k * (1 - inside), other_nodes)
        if a.moe_router_group_topk:
            copies_outside = min(copies_outside, a.moe_router_group_topk)
        network = cal.ALLTOALL_NETWORK_EFFICIENCY
        if dispatcher == "flex_deepep":
            network *= DEEPEP_RELATIVE_EFFICIENCY
        sms = e.get("dispatcher_sms")
        default_sms = w.model.perf_defaults.get("dispatcher_sms")
        if sms and default_sms:
            network *= (sms / default_sms) ** FLEX_SMS_EXPONENT
    return (copies_inside / (gpu.nvlink_gbps * cal.ALLTOALL_NVLINK_EFFICIENCY)
            + copies_outside / (w.cluster.scale_out_gbps * network))


def _overlap_left(e: dict) -> float:
    return 1.0 - EP_OVERLAP_HIDDEN if e.get("ep_overlap") else 1.0


def _launch_overhead_s(w: Workload, layout: LayoutConfig) -> float:
    """The per-layer launch part of the overhead term (step_time's `per_layer` share, all micro-batches)."""
    a = w.model.architecture
    layers = a.num_layers / layout.pp
    moe_share = a.num_moe_layers / a.num_layers if a.is_moe else 0.0
    per_layer = moe_share * cal.MOE_LAYER_OVERHEAD_S + (1 - moe_share) * cal.DENSE_LAYER_OVERHEAD_S
    microbatches = w.global_batch_size / max(1, layout.mbs * _dp(w, layout))
    return microbatches * layers * per_layer


def _modules(value: str | None) -> tuple[float, float]:
    modules = [m for m in (value or "").split("+") if m]
    compute = sum(RECOMPUTE_MODULE[m][0] for m in modules)
    freed = 1 - math.prod(1 - RECOMPUTE_MODULE[m][1] for m in modules)
    return compute, min(freed, 0.9)
