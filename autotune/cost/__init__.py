"""The analytical cost model: FLOPs, memory, step time, MFU and a time breakdown.

`estimate_many` evaluates a whole set of layouts at once (numpy arrays); `estimate` is one layout.
It is the `simulate` backend, the memory pre-filter and the prior that ranks candidates. MFU is
always against the GPU's dense BF16 peak, whatever the precision (as Megatron-Bridge reports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from autotune.config import LayoutConfig, Workload
from autotune.cost._arrays import LayoutArrays
from autotune.cost.flops import FlopsPerToken, flops_per_token, padded_vocab_size
from autotune.cost.memory import GIB, memory_breakdown, total_params
from autotune.cost.step_time import TERMS, flops_arrays, step_time_breakdown

MFU_BASIS = "dense BF16 peak"


@dataclass
class Estimates:
    """Predictions for many layouts; every field is an array aligned with the input layouts."""

    flops_per_token: np.ndarray
    step_time_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray
    peak_mem_gib: np.ndarray
    fits: np.ndarray
    memory_gib: dict[str, np.ndarray]
    breakdown_s: dict[str, np.ndarray]
    memory_limit_gib: float

    def __len__(self) -> int:
        return len(self.step_time_s)

    def row(self, index: int) -> "Estimate":
        return Estimate(
            flops_per_token=float(self.flops_per_token[index]),
            step_time_s=float(self.step_time_s[index]),
            tokens_per_s_per_gpu=float(self.tokens_per_s_per_gpu[index]),
            tflops_per_gpu=float(self.tflops_per_gpu[index]),
            mfu=float(self.mfu[index]),
            peak_mem_gib=float(self.peak_mem_gib[index]),
            fits=bool(self.fits[index]),
            memory={k: float(v[index]) for k, v in self.memory_gib.items()},
            breakdown={k: float(v[index]) for k, v in self.breakdown_s.items()},
            memory_limit_gib=self.memory_limit_gib,
        )


@dataclass(frozen=True)
class Estimate:
    """The prediction for one layout (see Estimates)."""

    flops_per_token: float
    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    peak_mem_gib: float
    fits: bool
    memory: dict[str, float] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_limit_gib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops_per_token": self.flops_per_token,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_basis": MFU_BASIS,
            "peak_mem_gib": self.peak_mem_gib,
            "memory_limit_gib": self.memory_limit_gib,
            "fits": self.fits,
            "memory": dict(self.memory),
            "breakdown": dict(self.breakdown),
        }


def estimate_many(workload: Workload, layouts: Sequence[LayoutConfig] | LayoutArrays,
                  memory_scale: float = 1.0) -> Estimates:
    """Predict every layout. `memory_scale` multiplies predicted memory (a measured calibration)."""
    x = layouts if isinstance(layouts, LayoutArrays) else LayoutArrays.from_configs(layouts)
    memory = memory_breakdown(x, workload)
    flops = flops_arrays(x, workload)
    breakdown = step_time_breakdown(x, workload, flops)
    step = sum(breakdown[t] for t in TERMS)
    tokens = workload.global_batch_size * workload.seq_length
    fpt = sum(flops)
    tokens_per_s_per_gpu = tokens / (step * workload.cluster.gpus)
    tflops = fpt * tokens_per_s_per_gpu / 1e12
    gpu = workload.cluster.gpu
    peak_gib = memory.total * memory_scale / GIB
    return Estimates(
        flops_per_token=fpt,
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        tflops_per_gpu=tflops,
        mfu=tflops / gpu.bf16_peak_tflops,
        peak_mem_gib=peak_gib,
        fits=peak_gib <= gpu.memory_gib,
        memory_gib={
            "weights_grads_optimizer_gib": memory.weights_grads_optimizer * memory_scale / GIB,
            "activations_gib": memory.activations * memory_scale / GIB,
            "overhead_gib": memory.overhead * memory_scale / GIB,
        },
        breakdown_s=breakdown,
        memory_limit_gib=gpu.memory_gib,
    )


def estimate(workload: Workload, layout: LayoutConfig, memory_scale: float = 1.0) -> Estimate:
    return estimate_many(workload, [layout], memory_scale).row(0)


__all__ = ["Estimate", "Estimates", "FlopsPerToken", "LayoutArrays", "MFU_BASIS", "TERMS", "estimate",
           "estimate_many", "flops_per_token", "padded_vocab_size", "total_params"]
