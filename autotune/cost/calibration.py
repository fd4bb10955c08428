"""Constants of the analytical model, each named and documented.

Fitted (FITTED, by `benchmarks/validate_cost_model.py --fit`, least squares of log(predicted /
published) tokens/s over the latest published Megatron-Bridge row of each workload, model, system and
precision in shared/data/published_bridge_perf_calibration.csv): the BF16 GEMM efficiency of Hopper
and Blackwell, the NVFP4 factor, Blackwell Ultra's sustained clock, the routed-expert GEMM slowdown
shared by every MoE model and the HBM passes of the elementwise work on activations. The MXFP8
factor comes from the published same-layout FP8/MXFP8 pairs. Ampere's efficiency is fitted to the
public vTrain A100 sweeps. Nothing is fitted per model or per row; the benchmark judges the fit on
models and systems left out of it. The other constants are engineering estimates, stated here.
"""

from __future__ import annotations

# Share of the dense BF16 peak that large BF16 GEMMs reach, per GPU generation. Fitted: Hopper and
# Blackwell to the published Megatron-Bridge rows, Ampere to the public vTrain A100 sweeps.
GENERATION_EFFICIENCY: dict[str, float] = {
    "ampere": 0.631,
    "hopper": 0.670,
    "blackwell": 0.615,
}
# Share of a low-precision peak reached, relative to BF16's share (scaling, casts, amax / block
# scales): the same on every generation that has the format. NVFP4 fitted. FP8 fixed at a prior
# (cuBLAS FP8 GEMMs reach ~0.95 of BF16's share of peak): BF16 rows are all MoE, so fitting FP8 too
# would trade the BF16 efficiency against the MoE terms. MXFP8 = FP8's 0.95 x 0.945, the median
# MXFP8/FP8 throughput ratio of the 11 pairs the published tables run in one release on the same
# model, system and layout (0.89-0.98; per-32-element block scales cost more quantisation work than
# one scale per tensor). A whole-step ratio, so the GEMMs' own gap is if anything larger; and it reads
# every model's pairs, the held-out model's included. Left to the fit with the elementwise term,
# MXFP8 rose above FP8 (0.964) to serve DeepSeek-V3's newer-release MXFP8 rows, and 16 of the 51
# same-release pairs came out in the wrong order (measured while choosing; 51/51 agree at 0.90).
PRECISION_EFFICIENCY: dict[str, float] = {
    "bf16": 1.0,
    "fp8": 0.95,
    "mxfp8": 0.90,
    "nvfp4": 0.665,
}

# Blackwell Ultra (B300, GB300: 1,400 W) holds higher tensor-core clocks under load than B200 /
# GB200 (1,000 / 1,200 W) at the same data-sheet peak; throughput relative to the others. Fitted:
# 1.28 is more than a clock alone plausibly gives, so it likely absorbs other B300 / GB300 error (the
# B300 rows stay the worst held out).
BLACKWELL_ULTRA_CLOCK = 1.281
BLACKWELL_ULTRA = ("b300", "gb300")


def sustained_clock(gpu_name: str) -> float:
    """Sustained tensor-core clock relative to the clock behind the GPU's data-sheet peak."""
    return BLACKWELL_ULTRA_CLOCK if gpu_name in BLACKWELL_ULTRA else 1.0


# GEMM efficiency falls as matrices shrink: factor = 1 / (1 + M_HALF / m) / (1 + N_HALF / n), where
# m is tokens per GEMM on one GPU and n the GEMM's output width on one GPU.
GEMM_TOKENS_HALF = 192.0
GEMM_WIDTH_HALF = 96.0

# Fixed cost per transformer layer and micro-batch (kernel launches, router and other small ops; the
# elementwise work that grows with the activations is ACTIVATION_HBM_PASSES below), seconds,
# forward + backward. MoE layers launch many more kernels (router, permutation, grouped GEMMs).
DENSE_LAYER_OVERHEAD_S = 0.15e-3
MOE_LAYER_OVERHEAD_S = 0.6e-3

# Bytes moved through HBM per routed token-copy per MoE layer (permute / unpermute, fwd + bwd),
# in units of hidden_size * 2 bytes.
MOE_PERMUTE_PASSES = 8.0
# Routed-expert GEMMs take this many times as long as dense GEMMs of the same FLOPs: grouped GEMMs
# over few tokens per expert, the slowest expert setting the pace, per-expert quantisation. Fitted
# across all MoE models at once (never per model).
MOE_EXPERT_GEMM_SLOWDOWN = 2.451
# Megatron-Bridge's fused MoE path (TrainingSettings.moe_fused_path: Transformer Engine's op fuser
# runs each expert MLP as fused grouped kernels, under a full-iteration CUDA graph with the EP
# communication overlapped) runs the routed-expert GEMMs this many times faster. Fitted across both MoE
# models (never per model); each alone gives a speed-up, of different size: 1.42 from DeepSeek-V3's rows
# (GPT-OSS held out), 1.23 from GPT-OSS-120B's (DeepSeek-V3 held out); it moves with the shared constants
# too (1.42-1.81 with a dense model held out). The graph and the overlap themselves are the knob model's
# constants (step_time), not this one.
MOE_FUSED_PATH_SPEEDUP = 1.435

# Elementwise work on GEMM activations (norms, SwiGLU, bias-dropout-add, casts, their backward) is
# bound by HBM, not by tensor cores: per token, (the GEMMs' FLOPs / 6 h) elements, each moved this
# many times in BF16 through HBM over forward and backward (step_time: part of `compute`). It makes
# narrow models slower per FLOP. Fitted across every model (one number). The MoE models pull it up
# and Llama3 8B pulls it down (fitted without DeepSeek-V3 17.8, without GPT-OSS-120B 19.6, without
# Llama3 8B 41.6): it partly absorbs the MoE models' unexplained slowness, and with 8B left out of
# the fit, 8B's rows go from over-predicted (+6..+20%, before the term) to under-predicted.
ACTIVATION_HBM_PASSES = 26.93

# Share of each communication's time that is NOT hidden behind compute.
EXPOSED_TP_WITH_SP = 0.35  # TE userbuffer overlap of AG/RS with GEMMs
EXPOSED_TP_WITHOUT_SP = 0.6
EXPOSED_TP_ACROSS_DOMAIN = 1.0  # userbuffer overlap needs CUDA IPC: a TP group leaving NVLink runs exposed
EXPOSED_CP = 0.3  # ring attention overlaps KV exchange with attention blocks
EXPOSED_EP = 0.6  # all-to-all dispatch/combine: partly overlapped by the 1F1B / shared-expert overlap
EXPOSED_PP = 0.3
EXPOSED_DP_MIN = 0.1  # the last gradient bucket / first parameter bucket are always exposed
# share of one micro-batch's compute (per model chunk) that hides gradient reduce-scatter / param all-gather
DP_OVERLAP_WINDOW = 0.7

# Achieved share of link bandwidth for large collectives (NCCL bus-bandwidth efficiency).
LINK_EFFICIENCY = 0.8
ALLTOALL_NVLINK_EFFICIENCY = 0.6  # small messages to many peers
ALLTOALL_NETWORK_EFFICIENCY = 0.85  # DeepEP / HybridEP inter-node kernels saturate the NIC

# Memory terms that the Korthikanti formulas leave out.
CUDA_CONTEXT_GIB = 1.5  # CUDA context, cuBLAS / cuDNN workspaces
NCCL_BUFFER_GIB_PER_GROUP = 0.25  # per communicator a rank belongs to (TP, CP, PP, DP, EP ...)
FRAGMENTATION_FRACTION = 0.07  # caching-allocator fragmentation, of allocated bytes
# Activations saved in FP8 by FP8 / FP4 recipes (linear-layer inputs) shrink activations by this factor.
LOW_PRECISION_ACTIVATION_FACTOR = 0.8

# Optimizer step: bytes of HBM traffic per parameter the rank updates (Adam, fp32 master, m, v, grads).
OPTIMIZER_BYTES_PER_PARAM = 36.0


def software_efficiency(generation: str, precision: str) -> float:
    """Share of the precision's tensor-core peak that large GEMMs reach on this generation."""
    return GENERATION_EFFICIENCY.get(generation, GENERATION_EFFICIENCY["hopper"]) * PRECISION_EFFICIENCY[precision]


# --- fitting (benchmarks/validate_cost_model.py) ------------------------------------------------
# The constants fitted to the published rows (Ampere's to the A100 sweeps); the rest are estimates.
FITTED = ["GENERATION_EFFICIENCY.hopper", "GENERATION_EFFICIENCY.blackwell", "PRECISION_EFFICIENCY.nvfp4",
          "BLACKWELL_ULTRA_CLOCK", "MOE_EXPERT_GEMM_SLOWDOWN", "ACTIVATION_HBM_PASSES", "MOE_FUSED_PATH_SPEEDUP"]
# Where a fit starts, and what a constant no training row depends on keeps (a generation left out
# with all its systems): engineering priors, never values fitted to the rows; and the fit's bounds.
PRIOR = {"GENERATION_EFFICIENCY.ampere": 0.6, "GENERATION_EFFICIENCY.hopper": 0.6,
         "GENERATION_EFFICIENCY.blackwell": 0.6, "PRECISION_EFFICIENCY.nvfp4": 0.6,
         "BLACKWELL_ULTRA_CLOCK": 1.0, "MOE_EXPERT_GEMM_SLOWDOWN": 1.1, "ACTIVATION_HBM_PASSES": 10.0,
         "MOE_FUSED_PATH_SPEEDUP": 1.0}
FIT_BOUNDS = {"GENERATION_EFFICIENCY.ampere": (0.1, 1.0), "GENERATION_EFFICIENCY.hopper": (0.1, 1.0),
              "GENERATION_EFFICIENCY.blackwell": (0.1, 1.0), "PRECISION_EFFICIENCY.nvfp4": (0.1, 1.2),
              "BLACKWELL_ULTRA_CLOCK": (0.8, 1.5), "MOE_EXPERT_GEMM_SLOWDOWN": (1.0, 4.0),
              "ACTIVATION_HBM_PASSES": (0.5, 200.0), "MOE_FUSED_PATH_SPEEDUP": (0.5, 4.0)}

# 80% prediction intervals. Throughput: log(predicted / measured) tokens/s on a model the constants
# never saw, from the leave-one-model-out residuals of the 43 published rows (benchmarks/
# validate_cost_model.py, model_interval): a normal interval whose variance counts the spread between
# models' mean errors apart from the spread within a model (rows of one model share their error).
# A measurement lands in [predicted * exp(-P90), predicted * exp(-P10)] about four times in five:
# nested check (interval built without the held-out model) 72% of held-out rows (dense 20/25, MoE
# 11/18: too narrow for MoE models).
THROUGHPUT_LOG_RATIO_P10 = -0.274
THROUGHPUT_LOG_RATIO_P90 = 0.245
# Peak memory: only three public peak figures exist (Megatron-Bridge skill cards): Llama3-70B SFT on
# 32 H100, FP8, TP4 PP4 VPP5 and VPP10: predicted state + activations +3% and -1% against the peak
# allocated (58.8 and 60.2 GB); DeepSeek-V3 PP4 VPP4 EP64 on 256 GPUs "without optimization": -4%
# against the card's 199.5 GB (BF16, fp32 gradients assumed; the card does not say it was measured).
# Three points give no percentile: +-10% covers them with a margin for layouts unlike them.
MEMORY_LOG_RATIO_P10 = -0.10
MEMORY_LOG_RATIO_P90 = 0.10
Z_80 = 1.2816  # the standard normal's 90th percentile: an 80% interval is +-Z_80 sd


def interval_log_std(p10: float, p90: float) -> float:
    """The log-scale standard deviation of a normal error with this 80% interval."""
    return (p90 - p10) / (2 * Z_80)
