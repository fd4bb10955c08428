"""Constants of the analytical model, each named and documented.

`SOFTWARE_EFFICIENCY` is the only fitted table: one number per (GPU generation, precision), the
share of the tensor-core peak that Megatron-Bridge's GEMMs reach on large, well-shaped matrices.
It was fitted by `benchmarks/validate_cost_model.py --fit` to the latest published Megatron-Bridge
throughput of each model/system (shared/data/published_bridge_perf_calibration.csv); the benchmark
also prints a leave-one-out error so the fit is not judged on its own training rows. Nothing is
fitted per model or per row. The other constants are engineering estimates, stated here.
"""

from __future__ import annotations

# Share of peak reached by large GEMMs, per (generation, precision). Fitted (see module docstring).
SOFTWARE_EFFICIENCY: dict[tuple[str, str], float] = {
    # rows behind each value (latest releases): hopper bf16 2 (GPT-OSS-120B, Qwen3-30B-A3B), hopper
    # fp8 6, blackwell bf16 1 (GPT-OSS-120B only: weakly determined), fp8 10, mxfp8 17, nvfp4 2.
    ("hopper", "bf16"): 0.2725,
    ("hopper", "fp8"): 0.5175,
    ("blackwell", "bf16"): 0.2100,
    ("blackwell", "fp8"): 0.5875,
    ("blackwell", "mxfp8"): 0.5000,
    ("blackwell", "nvfp4"): 0.4625,
    # No published A100 rows: assumed equal to Hopper BF16 (same software path), not fitted.
    ("ampere", "bf16"): 0.2725,
}

# GEMM efficiency falls as matrices shrink: factor = 1 / (1 + M_HALF / m) / (1 + N_HALF / n), where
# m is tokens per GEMM on one GPU and n the GEMM's output width on one GPU.
GEMM_TOKENS_HALF = 192.0
GEMM_WIDTH_HALF = 96.0

# Fixed cost per transformer layer and micro-batch (kernel launches, norms, small ops), seconds,
# forward + backward. MoE layers launch many more kernels (router, permutation, grouped GEMMs).
DENSE_LAYER_OVERHEAD_S = 0.15e-3
MOE_LAYER_OVERHEAD_S = 0.6e-3

# Bytes moved through HBM per routed token-copy per MoE layer (permute / unpermute, fwd + bwd),
# in units of hidden_size * 2 bytes.
MOE_PERMUTE_PASSES = 8.0
# Routed experts are not perfectly balanced even with aux loss: the slowest expert sets the pace.
MOE_IMBALANCE = 1.10

# Share of each communication's time that is NOT hidden behind compute.
EXPOSED_TP_WITH_SP = 0.35  # TE userbuffer overlap of AG/RS with GEMMs
EXPOSED_TP_WITHOUT_SP = 0.6
EXPOSED_CP = 0.3  # ring attention overlaps KV exchange with attention blocks
EXPOSED_EP = 0.6  # all-to-all dispatch/combine: partly overlapped by the 1F1B / shared-expert overlap
EXPOSED_PP = 0.3
EXPOSED_DP_MIN = 0.1  # the last gradient bucket / first parameter bucket are always exposed
DP_OVERLAP_WINDOW = 0.7  # share of compute time that can hide gradient reduce-scatter / param all-gather

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
    key = (generation, precision)
    if key in SOFTWARE_EFFICIENCY:
        return SOFTWARE_EFFICIENCY[key]
    return SOFTWARE_EFFICIENCY.get((generation, "bf16"), 0.5)
