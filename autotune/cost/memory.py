"""Peak memory of the most loaded rank (Megatron's theoretical_memory_utils; Korthikanti et al. 2022).

Weights + gradients + optimizer: 18 bytes per parameter (bf16 weight, fp32 gradient, fp32 master,
Adam m and v); with the distributed optimizer 6 + 12 / shard, where the dense shard is DP*CP and
the expert shard the expert-data-parallel size world / (PP*EP*ETP). Recipes that reduce gradients
in BF16 (Megatron-Bridge's performance recipes: grad_reduce_in_fp32=False) keep a 2-byte gradient
buffer: 4 + 12 / shard (the optimizer's fp32 copy of its gradient shard lives only in the optimizer
step, after the activations are freed). Routed experts are counted in
full (all experts, divided by PP*EP*ETP), not only the active ones.

Activations per layer and micro-batch, with the selective recompute of core attention that flash
attention gives for free: s*b*h*(18 + 4*r) bytes with sequence parallelism (all of it / TP),
s*b*h*(10 + (8 + 4*r)/TP) without; r = ffn / h (MoE: (moe_ffn*k + shared) / h); MoE layers add the
dispatch buffer of the permuted tokens, 2*k*s*b*h bytes. Everything / CP. The first pipeline stage
holds min(PP, microbatches) micro-batches in flight, times (1 + (PP-1)/(PP*VPP)) when interleaved;
the last stage one, or interleaved PP - (PP-1)/VPP stages' worth ((VPP-1)*PP + 1 chunk-micro-batches).
Full recompute works per model chunk: it keeps each checkpointed layer's input (2*s*b*h bytes) per
micro-batch in flight, plus one group's full activations while it is recomputed (once: one micro-batch
is recomputed at a time). The last stage also holds the logits: with the fused cross entropy
(GPTModelProvider's default, cross_entropy_loss_fusion=True) the bf16 logits and their in-place
gradient, about 4 bytes per vocab entry (the unfused loss keeps bf16 and fp32 copies plus the fp32
softmax: about 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.catalog import Architecture
from autotune.config import Workload
from autotune.cost import calibration as cal
from autotune.cost._arrays import LayoutArrays
from autotune.cost.flops import MAKE_VOCAB_SIZE_DIVISIBLE_BY

GIB = float(1 << 30)
LOGITS_BYTES_PER_ENTRY = 4.0  # fused cross entropy: bf16 logits + their gradient (module docstring)


@dataclass(frozen=True)
class TrainingSettings:
    """Recipe settings outside the layout that change memory and step time.

    The default is Megatron-Bridge's library recipes (DDP grad_reduce_in_fp32=True);
    PERF_RECIPE_SETTINGS is its performance recipes (perf_recipes/_common.py sets it False), the
    recipes behind the published throughput tables.
    """

    grad_reduce_in_fp32: bool = True
    # gradients reduced while the backward runs (Megatron's overlap_grad_reduce / param gather, and DDP
    # bucketing); False = older Megatron's local DDP, which all-reduces after the whole backward. Not the
    # performance knob of the same name (cost/knobs.py rescales an overlapped DP term relative to the
    # recipe's value): the benchmarks set this one for software that has no such knob (vTrain's sweeps)
    overlap_grad_reduce: bool = True
    # Megatron-Bridge's fused MoE path (its full-iteration MXFP8 performance recipes: Transformer Engine's
    # op fuser runs each expert MLP as fused grouped kernels, under a full-iteration CUDA graph with paged
    # activation stashing and the expert-parallel communication overlapped). Not a knob the tuner varies:
    # the published rows say which recipe ran it (published.FUSED_MOE_RECIPES). Its graph and EP overlap are
    # costed in step_time: not to be combined with the cuda_graph / ep_overlap knobs (cost/knobs.py), which
    # the published rows never set.
    moe_fused_path: bool = False
    # Megatron's overlap_moe_expert_parallel_comm (the recipes' moe_a2a_overlap): EP dispatch / combine hidden
    # behind the other micro-batch's compute; the fused path's recipes all set it. Published rows only, as above.
    moe_ep_overlap: bool = False

    @property
    def grad_bytes(self) -> float:
        return 4.0 if self.grad_reduce_in_fp32 else 2.0


DEFAULT_SETTINGS = TrainingSettings()
PERF_RECIPE_SETTINGS = TrainingSettings(grad_reduce_in_fp32=False)


@dataclass(frozen=True)
class ParamCounts:
    attention_per_layer: float
    dense_mlp_per_layer: float
    moe_shared_per_layer: float  # router + shared expert: replicated like dense weights
    experts_per_layer: float  # all routed experts of one layer
    embedding: float  # per copy (input embedding; the output layer is another copy unless tied)


def param_counts(a: Architecture) -> ParamCounts:
    h = a.hidden_size
    if a.uses_mla:
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        attention = (a.q_lora_rank * (h + a.num_attention_heads * qk) + a.kv_lora_rank * (
            h + a.num_attention_heads * (a.qk_head_dim + a.v_head_dim)) + h * a.qk_pos_emb_head_dim
            + a.num_attention_heads * a.v_head_dim * h)
    else:
        q = a.kv_channels * a.num_attention_heads
        attention = h * (q + 2 * a.kv_channels * a.num_query_groups) + q * h
    attention += 2 * h  # norms
    f = 3 if a.gated_linear_unit else 2
    experts = a.num_moe_experts * f * h * a.moe_ffn_hidden_size
    shared = (h * a.num_moe_experts + f * h * a.moe_shared_expert_ffn_hidden_size) if a.is_moe else 0
    return ParamCounts(attention, f * h * a.ffn_hidden_size, shared, experts, a.vocab_size * h)


def total_params(a: Architecture) -> float:
    p = param_counts(a)
    dense = a.num_layers if not a.is_moe else a.num_dense_layers
    moe = a.num_moe_layers
    copies = 1 if a.tie_embeddings else 2
    return (a.num_layers * p.attention_per_layer + dense * p.dense_mlp_per_layer
            + moe * (p.moe_shared_per_layer + p.experts_per_layer) + copies * p.embedding)


@dataclass
class MemoryBreakdown:
    """Bytes per GPU on the most loaded rank, as arrays over layouts."""

    weights_grads_optimizer: np.ndarray
    activations: np.ndarray
    overhead: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.weights_grads_optimizer + self.activations + self.overhead


def microbatches(x: LayoutArrays, w: Workload) -> np.ndarray:
    dp = w.cluster.gpus / (x.tp * x.pp * x.cp)
    return np.maximum(1.0, w.global_batch_size / (x.mbs * dp))


def stage_decoder_layers(x: LayoutArrays, w: Workload) -> np.ndarray:
    """Decoder layers on the first PP stage (one fewer when the embedding counts as a layer)."""
    m = w.model
    total = (m.architecture.num_layers + m.account_for_embedding_in_pipeline_split
             + m.account_for_loss_in_pipeline_split)
    per_stage = np.ceil(total / x.pp)
    return np.maximum(1.0, per_stage - (m.account_for_embedding_in_pipeline_split * (x.pp > 1)))


def full_recompute_per_chunk(x: LayoutArrays, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layers per model chunk, recompute_num_layers as it acts in a chunk, share of the stage's layers
    whose forward full recompute repeats). Megatron applies full recompute per TransformerBlock, one per
    model chunk: with VPP a stage holds VPP chunks of layers / VPP layers and recompute_num_layers counts
    within each. Uniform repeats every layer's forward; block the first n layers of each chunk."""
    chunk = np.maximum(1.0, np.ceil(layers / x.vpp))
    n = np.minimum(np.maximum(1.0, x.recompute_num_layers), chunk)
    share = np.where(x.recompute == 2, np.where(x.recompute_block, np.minimum(x.vpp * n, layers) / layers, 1.0), 0.0)
    return chunk, n, share


def _state_bytes(x: LayoutArrays, w: Workload, settings: TrainingSettings = DEFAULT_SETTINGS) -> np.ndarray:
    a = w.model.architecture
    p = param_counts(a)
    layers = stage_decoder_layers(x, w)
    moe_share = a.num_moe_layers / a.num_layers if a.is_moe else 0.0
    dense_mlp_share = 1.0 - moe_share
    vocab = _padded_vocab_vector(a.vocab_size, x.tp)
    embedding = vocab * a.hidden_size / x.tp
    copies_on_stage = np.where(x.pp == 1, 1 if a.tie_embeddings else 2, 1)
    dense = (layers * (p.attention_per_layer + dense_mlp_share * p.dense_mlp_per_layer
                       + moe_share * p.moe_shared_per_layer) / x.tp + embedding * copies_on_stage)
    experts = layers * moe_share * p.experts_per_layer / (x.ep * x.etp)
    dp = w.cluster.gpus / (x.tp * x.pp * x.cp)
    dense_shard = dp * x.cp
    expert_shard = w.cluster.gpus / (x.pp * x.ep * x.etp)
    # weight (2) + gradient buffer, then master, m and v (12, fp32), sharded by the distributed
    # optimizer. With a 2-byte gradient buffer the optimizer's fp32 copy of its gradient shard exists
    # only during the optimizer step, when the activations are freed: not at the peak.
    grad = settings.grad_bytes
    per_param_dense = 2 + grad + 12 / np.where(x.dist_opt, dense_shard, 1.0)
    per_param_expert = 2 + grad + 12 / np.where(x.dist_opt, expert_shard, 1.0)
    return dense * per_param_dense + experts * per_param_expert


def _padded_vocab_vector(vocab: int, tp: np.ndarray) -> np.ndarray:
    """`flops.padded_vocab_size` over an array of TP sizes."""
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return np.ceil(vocab / multiple) * multiple


def _layer_activation_bytes(x: LayoutArrays, w: Workload) -> np.ndarray:
    """Saved activations of one layer for one micro-batch on one GPU (no full recompute)."""
    a = w.model.architecture
    h, s = a.hidden_size, w.seq_length
    sbh = s * x.mbs * h / x.cp
    if a.is_moe:
        moe_share = a.num_moe_layers / a.num_layers
        ratio_moe = (a.moe_ffn_hidden_size * a.moe_router_topk + a.moe_shared_expert_ffn_hidden_size) / h
        ratio = moe_share * ratio_moe + (1 - moe_share) * a.ffn_hidden_size / h
        dispatch = moe_share * 2 * a.moe_router_topk
    else:
        ratio, dispatch = a.ffn_hidden_size / h, 0.0
    with_sp = (18 + 4 * ratio + dispatch) / x.tp
    without_sp = 10 + (8 + 4 * ratio + dispatch) / x.tp
    per_layer = sbh * np.where(x.sp, with_sp, without_sp)
    if w.precision != "bf16":
        per_layer = per_layer * cal.LOW_PRECISION_ACTIVATION_FACTOR
    return per_layer


def _activation_bytes(x: LayoutArrays, w: Workload) -> np.ndarray:
    a = w.model.architecture
    layers = stage_decoder_layers(x, w)
    per_layer = _layer_activation_bytes(x, w)
    layer_input = 2 * w.seq_length * x.mbs * a.hidden_size / x.cp / np.where(x.sp, x.tp, 1)
    full = x.recompute == 2
    # Full recompute acts on each model chunk (full_recompute_per_chunk). Uniform checkpoints
    # every n layers and recomputes one group at a time; block recomputes the first n layers of the chunk
    # and stores the rest in full. What a micro-batch keeps while it waits for its backward is its
    # checkpoints (and block's stored layers); the recomputed group's full activations live only while
    # that group's backward runs, for one micro-batch at a time, so they count once per stage and not
    # once per micro-batch in flight (Korthikanti et al. 2022, section 4: 2*s*b*h*L plus one layer's
    # activations). Block with layers stored in full needs no more: by the time its first n layers are
    # recomputed, the stored layers of that micro-batch have been freed by their own backward.
    chunk, n, _ = full_recompute_per_chunk(x, layers)
    uniform = x.vpp * np.ceil(chunk / n) * layer_input
    block = np.minimum(x.vpp * n, layers) * layer_input + np.maximum(0.0, layers - x.vpp * n) * per_layer
    kept = np.where(full, np.where(x.recompute_block, block, uniform), layers * per_layer)
    working = np.where(full, np.where(x.recompute_block, np.where(n >= chunk, 1.0, 0.0), n) * per_layer, 0.0)
    m = microbatches(x, w)
    in_flight = np.minimum(x.pp, m)
    interleave = np.where(x.vpp > 1, 1 + (x.pp - 1) / (x.pp * x.vpp), 1.0)
    first_stage = kept * in_flight * interleave + working
    vocab = _padded_vocab_vector(a.vocab_size, x.tp)
    logits = LOGITS_BYTES_PER_ENTRY * w.seq_length * x.mbs * vocab / (x.tp * x.cp)
    # the last stage runs each micro-batch's backward right after its forward, but interleaved it holds
    # the other chunks' forwards in flight: (VPP-1)*PP + 1 chunk-micro-batches, PP - (PP-1)/VPP stages' worth
    last_in_flight = np.where(x.vpp > 1, in_flight - (in_flight - 1) / x.vpp, 1.0)
    last_stage_layers = kept * np.where(x.pp == 1, in_flight * interleave, last_in_flight) + working
    return np.maximum(first_stage + np.where(x.pp == 1, logits, 0), last_stage_layers + logits)


def _communicator_count(x: LayoutArrays, w: Workload) -> np.ndarray:
    dp = w.cluster.gpus / (x.tp * x.pp * x.cp)
    groups = [x.tp, x.cp, x.pp, dp, x.ep, x.etp]
    return sum((g > 1).astype(np.float64) for g in groups) + 1


def memory_breakdown(x: LayoutArrays, w: Workload, settings: TrainingSettings = DEFAULT_SETTINGS) -> MemoryBreakdown:
    state = _state_bytes(x, w, settings)
    activations = _activation_bytes(x, w)
    overhead = ((cal.CUDA_CONTEXT_GIB + cal.NCCL_BUFFER_GIB_PER_GROUP * _communicator_count(x, w)) * GIB
                + cal.FRAGMENTATION_FRACTION * (state + activations))
    return MemoryBreakdown(state, activations, overhead)
