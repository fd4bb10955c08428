"""The analytical cost model: FLOPs, memory, step time, MFU and a time breakdown.

`estimate_many` evaluates a whole set of layouts at once (numpy arrays); `estimate` is one layout.
It is the `simulate` backend, the memory pre-filter and the prior that ranks candidates. MFU is
always against the GPU's dense BF16 peak, whatever the precision (as Megatron-Bridge reports it).
Every estimate carries an 80% prediction interval for throughput and peak memory, from the
validation residuals (calibration.THROUGHPUT_LOG_RATIO_* and MEMORY_LOG_RATIO_*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.config import LayoutConfig, Workload
from autotune.cost import calibration as cal
from autotune.cost._arrays import LayoutArrays
from autotune.cost.flops import FlopsPerToken, flops_per_token, padded_vocab_size
from autotune.cost.memory import (
    DEFAULT_SETTINGS,
    GIB,
    PERF_RECIPE_SETTINGS,
    TrainingSettings,
    memory_breakdown,
    total_params,
)
from autotune.cost.step_time import TERMS, flops_arrays, step_time_breakdown

MFU_BASIS = "dense BF16 peak"


def throughput_interval(predicted):
    """80% prediction interval (low, high) of a measured throughput (tokens/s or TFLOP/s) given the
    predicted one: predicted / measured has its 10th-90th percentiles at exp(P10)..exp(P90)."""
    return predicted * math.exp(-cal.THROUGHPUT_LOG_RATIO_P90), predicted * math.exp(-cal.THROUGHPUT_LOG_RATIO_P10)


def memory_interval(predicted_gib):
    """80% prediction interval (low, high) of a measured peak memory given the predicted one."""
    return predicted_gib * math.exp(-cal.MEMORY_LOG_RATIO_P90), predicted_gib * math.exp(-cal.MEMORY_LOG_RATIO_P10)


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

    @property
    def tokens_per_s_per_gpu_80(self) -> tuple[np.ndarray, np.ndarray]:
        """80% prediction interval of the measured tokens/s/GPU (throughput_interval)."""
        return throughput_interval(self.tokens_per_s_per_gpu)

    @property
    def peak_mem_gib_80(self) -> tuple[np.ndarray, np.ndarray]:
        """80% prediction interval of the measured peak memory (memory_interval)."""
        return memory_interval(self.peak_mem_gib)

    def row(self, index: int) -> Estimate:
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

    @property
    def tokens_per_s_per_gpu_80(self) -> tuple[float, float]:
        return throughput_interval(self.tokens_per_s_per_gpu)

    @property
    def tflops_per_gpu_80(self) -> tuple[float, float]:
        return throughput_interval(self.tflops_per_gpu)

    @property
    def step_time_s_80(self) -> tuple[float, float]:
        low, high = throughput_interval(1.0)
        return self.step_time_s / high, self.step_time_s / low

    @property
    def peak_mem_gib_80(self) -> tuple[float, float]:
        return memory_interval(self.peak_mem_gib)

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
            # 80% prediction intervals (low, high) from the validation residuals
            "interval_80": {"step_time_s": list(self.step_time_s_80),
                            "tokens_per_s_per_gpu": list(self.tokens_per_s_per_gpu_80),
                            "tflops_per_gpu": list(self.tflops_per_gpu_80),
                            "peak_mem_gib": list(self.peak_mem_gib_80)},
        }


def estimate_many(workload: Workload, layouts: Sequence[LayoutConfig] | LayoutArrays,
                  memory_scale: float = 1.0, settings: TrainingSettings = DEFAULT_SETTINGS) -> Estimates:
    """Predict every layout. `memory_scale` multiplies predicted memory (a measured calibration);
    `settings` are the recipe settings outside the layout (memory.TrainingSettings)."""
    x = layouts if isinstance(layouts, LayoutArrays) else LayoutArrays.from_configs(layouts)
    memory = memory_breakdown(x, workload, settings)
    flops = flops_arrays(x, workload)
    breakdown = step_time_breakdown(x, workload, flops, settings)
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


def estimate(workload: Workload, layout: LayoutConfig, memory_scale: float = 1.0,
             settings: TrainingSettings = DEFAULT_SETTINGS) -> Estimate:
    """One layout; its performance knobs (issue 16) rescale the terms they act on (cost/knobs.py)."""
    base = estimate_many(workload, [layout], memory_scale, settings).row(0)
    if layout.perf():
        from autotune.cost.knobs import adjust

        return adjust(workload, layout, base)
    return base


__all__ = [
    "DEFAULT_SETTINGS",
    "MFU_BASIS",
    "PERF_RECIPE_SETTINGS",
    "TERMS",
    "Estimate",
    "Estimates",
    "FlopsPerToken",
    "LayoutArrays",
    "TrainingSettings",
    "estimate",
    "estimate_many",
    "flops_per_token",
    "memory_interval",
    "padded_vocab_size",
    "throughput_interval",
    "total_params",
]
