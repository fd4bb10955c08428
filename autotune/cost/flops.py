"""Model FLOPs exactly as Megatron-Bridge counts them (training/utils/flop_utils.py,
`num_floating_point_operations`, transformer branch): forward + backward (3x), FMA = 2 FLOPs,
GQA or MLA attention, causal core attention, sliding windows, SwiGLU, routed and shared experts,
MTP layers, and the vocabulary padded to a multiple of 128 * TP. Recompute is not counted: these
are model FLOPs, the numerator of MFU.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.catalog import Architecture

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token, split into the parts that run on different kernels."""

    dense_mlp: float
    expert_mlp: float
    attention_projections: float
    core_attention: float  # QK^T and attention-times-V: runs in BF16 even under FP8 recipes
    logits: float

    @property
    def total(self) -> float:
        return self.dense_mlp + self.expert_mlp + self.attention_projections + self.core_attention + self.logits


def _layer_counts(a: Architecture) -> tuple[int, int, int]:
    """(attention layers, dense-MLP layers, MoE layers), MTP layers included like the final layer."""
    mtp = a.mtp_num_layers
    if a.is_moe:
        moe, dense = a.num_moe_layers + mtp, a.num_dense_layers
    else:
        moe, dense = 0, a.num_layers + mtp
    return a.num_layers + mtp, dense, moe


def _attention_per_layer(a: Architecture, seq_length: int) -> tuple[float, float]:
    """(projection, core) multiply-accumulates per token of one layer, before the 3 * 2 factor."""
    heads, h = a.num_attention_heads, a.hidden_size
    if a.uses_mla:
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q_term = a.q_lora_rank * (h + heads * qk + 1) if a.q_lora_rank else h * heads * qk
        projection = (q_term + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + 1)
                      + h * a.qk_pos_emb_head_dim + heads * a.v_head_dim * h)
        core = seq_length * heads * qk / 2 + seq_length * heads * a.v_head_dim / 2
        return projection, core
    q = a.kv_channels * heads
    kv = a.kv_channels * a.num_query_groups
    projection = h * (q + 2 * kv) + q * h
    return projection, q * seq_length / 2 * 2


def _swa_context(a: Architecture, seq_length: int) -> float:
    window = a.sliding_window
    if window and window < seq_length:
        return window - window * (window - 1) / (2 * seq_length)
    return seq_length / 2


def flops_per_token(a: Architecture, seq_length: int, tp: int = 1) -> FlopsPerToken:
    """Training FLOPs per token of a sequence of `seq_length` (vocabulary padded for `tp`)."""
    num_layers, dense_layers, moe_layers = _layer_counts(a)
    f = 3 if a.gated_linear_unit else 2
    h = a.hidden_size
    dense_mlp = 6 * h * a.ffn_hidden_size * f * dense_layers
    expert_mlp = 6 * h * (a.moe_ffn_hidden_size * a.moe_router_topk * f
                          + a.moe_shared_expert_ffn_hidden_size * f) * moe_layers
    projection, core = _attention_per_layer(a, seq_length)
    if a.sliding_window and a.window_attn_skip_freq:
        full_layers = sum(1 for i in range(num_layers) if (i + 1) % a.window_attn_skip_freq == 0)
        swa_layers = num_layers - full_layers
        q = a.kv_channels * a.num_attention_heads
        core_total = 6 * (full_layers * core + swa_layers * q * _swa_context(a, seq_length) * 2)
    else:
        core_total = 6 * num_layers * core
    mtp_extra = 6 * a.mtp_num_layers * (3 * h + 2 * h * h)
    logits = 6 * h * padded_vocab_size(a.vocab_size, tp) * (a.mtp_num_layers + 1)
    return FlopsPerToken(dense_mlp=float(dense_mlp), expert_mlp=float(expert_mlp),
                         attention_projections=float(6 * num_layers * projection + mtp_extra),
                         core_attention=float(core_total), logits=float(logits))


def tokens_per_s_per_gpu(global_batch_size: int, seq_length: int, gpus: int, step_time_s: float) -> float:
    return global_batch_size * seq_length / (step_time_s * gpus)


def model_tflops_per_gpu(architecture: Architecture, seq_length: int, tp: int, tokens_per_s: float) -> float:
    """Model TFLOP/s per GPU at a throughput, counted as Megatron does (vocabulary padded for TP)."""
    return flops_per_token(architecture, seq_length, tp).total * tokens_per_s / 1e12


def measured_throughput(architecture: Architecture, bf16_peak_tflops: float, *, global_batch_size: int,
                        seq_length: int, gpus: int, tp: int, step_time_s: float) -> tuple[float, float, float]:
    """(tokens/s/GPU, model TFLOP/s/GPU, MFU against the dense BF16 peak) of a measured step time."""
    tokens = tokens_per_s_per_gpu(global_batch_size, seq_length, gpus, step_time_s)
    tflops = model_tflops_per_gpu(architecture, seq_length, tp, tokens)
    return tokens, tflops, tflops / bf16_peak_tflops
