"""Step time of one training iteration, as a breakdown (seconds per term, arrays over layouts).

compute      GEMMs at peak(precision) x software efficiency x a shape factor that falls as per-GPU
             matrices shrink (large TP or CP, small micro-batches, few tokens per local expert);
             core attention runs in BF16 whatever the recipe; the elementwise kernels on the GEMMs'
             activations, bound by HBM bandwidth.
recompute    the extra forward of full recompute (share of layers recomputed) or of core attention
             (selective).
overhead     fixed per-layer, per-micro-batch kernel cost; MoE token permutation through HBM.
tp/cp/ep/pp  exposed communication: volume / bandwidth of the link the group spans (NVLink inside an
             NVLink domain, else the scale-out network; all-to-all mixes both), times the share
             Megatron does not hide (calibration.EXPOSED_*).
bubble       (PP-1) / (VPP*m) of the pipeline's busy time.
dp           gradient reduce-scatter + parameter all-gather (distributed optimizer) or all-reduce,
             hidden behind one micro-batch of compute (the last backward, the first forward).
optimizer    the Adam step, HBM-bound, over the parameters this rank updates.
Groups are laid out as Megatron does (TP innermost, then CP, then DP; experts: ETP, EP, EDP; PP outermost).
"""

from __future__ import annotations

import numpy as np

from autotune.config import Workload
from autotune.cost import calibration as cal
from autotune.cost._arrays import LayoutArrays
from autotune.cost.flops import flops_per_token
from autotune.cost.memory import (
    DEFAULT_SETTINGS,
    TrainingSettings,
    full_recompute_per_chunk,
    microbatches,
    param_counts,
    stage_decoder_layers,
)

TERMS = ("compute", "recompute", "overhead", "tp", "cp", "ep", "pp", "bubble", "dp", "optimizer")
ATTENTION_EFFICIENCY = 0.75  # flash attention relative to a GEMM of the same precision


def flops_arrays(x: LayoutArrays, w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FLOPs per token split (dense GEMM, expert GEMM, core attention) as arrays; depends on TP via
    vocab. Their sum is the model FLOPs per token."""
    a = w.model.architecture
    dense = np.empty(len(x))
    expert = np.empty(len(x))
    core = np.empty(len(x))
    for tp in np.unique(x.tp):
        f = flops_per_token(a, w.seq_length, int(tp))
        mask = x.tp == tp
        dense[mask] = f.dense_mlp + f.attention_projections + f.logits
        expert[mask] = f.expert_mlp
        core[mask] = f.core_attention
    return dense, expert, core


def _shape_factor(tokens: np.ndarray, width: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + cal.GEMM_TOKENS_HALF / tokens) / (1.0 + cal.GEMM_WIDTH_HALF / width)


def _link_bytes_per_s(span: np.ndarray, w: Workload, stride: np.ndarray | float = 1.0) -> np.ndarray:
    """Bus bandwidth of a ring collective over a group of ranks `stride` apart spanning `span` ranks.

    Inside one NVLink domain: NVLink. Across domains, NCCL runs one ring per channel and each
    ring leaves a domain through a different NIC, so the group's members inside one domain pool
    their NICs: min(NVLink, members per domain x NIC) -- a TP-1 data-parallel group of 8-GPU nodes
    gets 8 NICs, a TP-8 one gets its own NIC.
    """
    gpu = w.cluster.gpu
    domain = w.cluster.nvlink_domain_gpus
    members_per_domain = np.maximum(1.0, np.minimum(span, domain) / stride)
    outside = np.minimum(gpu.nvlink_gbps, members_per_domain * w.cluster.scale_out_gbps)
    return np.where(span <= domain, gpu.nvlink_gbps, outside) * 1e9 * cal.LINK_EFFICIENCY


def _dispatch_s(tokens: np.ndarray, x: LayoutArrays, w: Workload) -> np.ndarray:
    """Seconds of one token dispatch (or combine) of `tokens` hidden states across the EP group.

    The recipes' flex dispatchers (DeepEP / HybridEP) send a token once per destination node, not
    once per expert copy, so the network carries min(copies on other nodes, other nodes reached)
    copies, further capped by node-limited routing (moe_router_group_topk). NVLink carries the
    copies that stay inside the NVLink domain.
    """
    a = w.model.architecture
    gpu = w.cluster.gpu
    span = x.ep * x.etp
    domain = float(w.cluster.nvlink_domain_gpus)
    inside = np.minimum(1.0, domain / span)
    k = a.moe_router_topk
    copies_inside = k * inside * (x.ep - 1) / x.ep
    other_nodes = np.maximum(0.0, np.ceil(span / domain) - 1)
    copies_outside = np.minimum(k * (1 - inside), other_nodes)
    if a.moe_router_group_topk:
        copies_outside = np.minimum(copies_outside, a.moe_router_group_topk)
    token_bytes = tokens * a.hidden_size * 2
    return token_bytes * (copies_inside / (gpu.nvlink_gbps * 1e9 * cal.ALLTOALL_NVLINK_EFFICIENCY)
                          + copies_outside / (w.cluster.scale_out_gbps * 1e9 * cal.ALLTOALL_NETWORK_EFFICIENCY))


def step_time_breakdown(x: LayoutArrays, w: Workload,
                        flops: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                        settings: TrainingSettings = DEFAULT_SETTINGS) -> dict[str, np.ndarray]:
    """Seconds per term (see the module docstring); `flops` is flops_arrays(x, w) when the caller has it;
    `settings` says in which precision gradients are reduced and whether the reduction overlaps the backward."""
    a = w.model.architecture
    gpu = w.cluster.gpu
    world, s, h = w.cluster.gpus, w.seq_length, a.hidden_size
    m = microbatches(x, w)
    layers = stage_decoder_layers(x, w)
    moe_share = a.num_moe_layers / a.num_layers if a.is_moe else 0.0
    tokens_per_gpu_step = w.global_batch_size * s / world

    # --- compute -------------------------------------------------------------------------------
    dense_fpt, expert_fpt, core_fpt = flops if flops is not None else flops_arrays(x, w)
    clock = cal.sustained_clock(gpu.name)
    peak = gpu.peak_tflops[w.precision] * 1e12 * clock
    peak_bf16 = gpu.peak_tflops["bf16"] * 1e12 * clock
    eff = cal.software_efficiency(gpu.generation, w.precision)
    eff_bf16 = cal.software_efficiency(gpu.generation, "bf16")
    gemm_tokens = x.mbs * s / x.cp
    t_dense = tokens_per_gpu_step * dense_fpt / (peak * eff * _shape_factor(gemm_tokens, h / x.tp))
    t_core = tokens_per_gpu_step * core_fpt / (
        peak_bf16 * eff_bf16 * ATTENTION_EFFICIENCY * _shape_factor(gemm_tokens, np.inf))
    if a.is_moe:
        tokens_per_rank = gemm_tokens / x.tp
        tokens_per_expert = tokens_per_rank * x.etp * a.moe_router_topk * x.ep / a.num_moe_experts
        expert_shape = _shape_factor(tokens_per_expert, a.moe_ffn_hidden_size / x.etp)
        t_expert = tokens_per_gpu_step * expert_fpt * cal.MOE_EXPERT_GEMM_SLOWDOWN / (peak * eff * expert_shape)
        if settings.moe_fused_path:  # fused grouped expert MLPs (calibration.MOE_FUSED_PATH_SPEEDUP)
            t_expert = t_expert / cal.MOE_FUSED_PATH_SPEEDUP
    else:
        tokens_per_rank = gemm_tokens / x.tp
        t_expert = np.zeros(len(x))
    # Elementwise kernels on the GEMMs' activations (norms, SwiGLU, bias-dropout-add, casts) are bound
    # by HBM, not tensor cores: elements per token ~ the GEMMs' FLOPs per token / (6 h), split over the
    # ranks like the GEMMs, so the same seconds for every layout (only TP's vocabulary padding differs):
    # a larger share of a fast layout's step, which draws layouts together; narrow models pay most.
    # Not modelled: without sequence parallelism, TP ranks repeat the hidden-size norms and adds.
    activation_elements = (dense_fpt + expert_fpt) / (6.0 * h)
    t_elementwise = tokens_per_gpu_step * activation_elements * 2.0 * cal.ACTIVATION_HBM_PASSES / (gpu.hbm_tbps * 1e12)
    compute = t_dense + t_expert + t_core + t_elementwise

    # --- recompute -----------------------------------------------------------------------------
    # the share of layers whose forward runs again: the same per-chunk reading as the memory model's, so a
    # layout is never credited with block recompute's small cost and full recompute's small memory at once
    _, _, recomputed_share = full_recompute_per_chunk(x, layers)
    recompute = recomputed_share * compute / 3 + (x.recompute == 1) * t_core / 3
    forward_repeat = 1 + recomputed_share / 2  # recomputed forwards repeat their forward communication

    # --- fixed overhead and MoE permutation ----------------------------------------------------
    per_layer = moe_share * cal.MOE_LAYER_OVERHEAD_S + (1 - moe_share) * cal.DENSE_LAYER_OVERHEAD_S
    permute_bytes = tokens_per_rank * a.moe_router_topk * h * 2 * cal.MOE_PERMUTE_PASSES if a.is_moe else 0.0
    launch = m * layers * per_layer * (1 + recomputed_share / 3)
    overhead = launch + m * layers * moe_share * permute_bytes / (gpu.hbm_tbps * 1e12)

    # --- communication -------------------------------------------------------------------------
    act_bytes = gemm_tokens * h * 2  # one micro-batch's hidden states on one CP rank, bf16
    tp_volume = (x.tp - 1) / x.tp * act_bytes * (4 + 4 * (1 - moe_share)) \
        + moe_share * 4 * (x.etp - 1) / x.etp * act_bytes
    tp_s = m * layers * tp_volume / _link_bytes_per_s(x.tp, w) * forward_repeat
    exposed_tp = np.where(x.sp, cal.EXPOSED_TP_WITH_SP, cal.EXPOSED_TP_WITHOUT_SP)
    tp = tp_s * np.where(x.tp > w.cluster.nvlink_domain_gpus, cal.EXPOSED_TP_ACROSS_DOMAIN, exposed_tp)

    if a.uses_mla:
        kv_per_token = a.num_attention_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim + a.v_head_dim) / x.tp
    else:
        kv_per_token = 2 * a.kv_channels * np.maximum(1.0, a.num_query_groups / x.tp)
    cp_volume = 3 * (x.cp - 1) * gemm_tokens * kv_per_token * 2
    cp = m * layers * cp_volume / _link_bytes_per_s(x.tp * x.cp, w, x.tp) * cal.EXPOSED_CP * forward_repeat

    if a.is_moe:
        # dispatch + combine, forward and backward
        ep = m * layers * moe_share * 4 * _dispatch_s(tokens_per_rank, x, w) * cal.EXPOSED_EP * forward_repeat
    else:
        ep = np.zeros(len(x))

    pp_bytes = 2 * act_bytes / np.where(x.sp, x.tp, 1.0)
    stage_span = world / x.pp
    pp_link = np.where(2 * stage_span <= w.cluster.nvlink_domain_gpus, gpu.nvlink_gbps, w.cluster.scale_out_gbps) * 1e9
    pp = np.where(x.pp > 1, m * x.vpp * pp_bytes / (pp_link * cal.LINK_EFFICIENCY), 0.0) * cal.EXPOSED_PP

    if (settings.moe_fused_path or settings.moe_ep_overlap) and a.is_moe:
        # The fused path's full-iteration CUDA graph and a recipe's expert-parallel overlap, by the knob
        # model's own constants (relative to the scoped graphs of the recipes without it), so that the one
        # constant fitted for the path (the expert speed-up above) does not also absorb these two.
        from autotune.cost.knobs import EP_OVERLAP_HIDDEN, UNGRAPHED_SHARE  # knobs imports this package
        if settings.moe_fused_path:
            overhead = overhead - launch * (1 - UNGRAPHED_SHARE["full_iteration"] / UNGRAPHED_SHARE["te_attn_router"])
        ep = ep * (1 - EP_OVERLAP_HIDDEN)
    busy = compute + recompute + overhead + tp + cp + ep + pp
    bubble = (x.pp - 1) / (x.vpp * m) * busy

    # --- data parallel and optimizer -----------------------------------------------------------
    p = param_counts(a)
    dense_params = layers * (p.attention_per_layer + (1 - moe_share) * p.dense_mlp_per_layer
                             + moe_share * p.moe_shared_per_layer) / x.tp + p.embedding / x.tp
    expert_params = layers * moe_share * p.experts_per_layer / (x.ep * x.etp)
    dense_group = world / (x.tp * x.pp)  # DP * CP
    expert_group = world / (x.pp * x.ep * x.etp)
    grad = settings.grad_bytes  # reduce-scatter of gradients + all-gather of bf16 params, or an all-reduce
    per_param = np.where(x.dist_opt, grad + 2.0, 2 * grad)
    dp_s = per_param * ((dense_group - 1) / dense_group * dense_params / _link_bytes_per_s(stage_span, w, x.tp)
                        + (expert_group - 1) / expert_group * expert_params
                        / _link_bytes_per_s(stage_span, w, x.ep * x.etp))
    # Gradients are complete only in the last micro-batch's backward and parameters are needed in the
    # first micro-batch's forward: Megatron's overlap_grad_reduce / overlap_param_gather hide the
    # collectives behind one micro-batch of compute (per model chunk), not behind the whole step.
    window = compute / m * np.minimum(x.vpp, m)
    dp = np.maximum(cal.EXPOSED_DP_MIN * dp_s, dp_s - cal.DP_OVERLAP_WINDOW * window)
    if not settings.overlap_grad_reduce:
        dp = dp_s
    updated = np.where(x.dist_opt, dense_params / dense_group + expert_params / expert_group,
                       dense_params + expert_params)
    optimizer = updated * cal.OPTIMIZER_BYTES_PER_PARAM / (gpu.hbm_tbps * 1e12)

    return {"compute": compute, "recompute": recompute, "overhead": overhead, "tp": tp, "cp": cp, "ep": ep,
            "pp": pp, "bubble": bubble, "dp": dp, "optimizer": optimizer}
