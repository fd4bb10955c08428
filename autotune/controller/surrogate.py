"""What the search learns from measurements: a throughput surrogate and a memory feasibility model.

Throughput: a Gaussian process (scikit-learn) on the residual log(measured / predicted) over layout
features that carry the physics the cost model may get wrong (per-GPU GEMM shape, tokens per local
expert, groups that leave the NVLink domain, bubble, exposed communication, recompute, memory
headroom), with a constant mean. The cost model (calibrated) is the GP's prior mean, so one
measurement moves every similar layout, and far from any measurement the prior rules again with its
stated uncertainty (PRIOR_LOG_STD). A white-noise term absorbs run-to-run noise.

Memory: log(measured peak / predicted peak) = global error + structural-family error + noise, a
linear-Gaussian model with the memory model's stated error as its prior. A measured OOM is a
censored observation (the peak was at least the GPU's memory). The probability that a layout fits
is then P(log peak < log limit), used as a constraint by the search: a promising layout predicted
just above the limit is worth a run, one predicted safely below it still carries a risk.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from autotune.config import Workload
from autotune.cost import Estimates, LayoutArrays
from autotune.cost import calibration as cost_calibration

# Prior error of the (uncalibrated) throughput model between layouts of one study, log scale:
# ~+-15% (1 sd), the GP's amplitude.
PRIOR_LOG_STD = 0.15
# Prior of the study-wide offset (the GP's constant mean): the cost model's error on a model or
# system it was not fitted on, the sd of its 80% prediction interval (leave-one-model-out residuals).
OFFSET_PRIOR_LOG_STD = cost_calibration.interval_log_std(cost_calibration.THROUGHPUT_LOG_RATIO_P10,
                                                         cost_calibration.THROUGHPUT_LOG_RATIO_P90)
# Run-to-run noise of a short profiling run (log scale, 1 sd) before any repeat measures it.
NOISE_LOG_STD = 0.03
# Memory model: global error prior (1 sd, log: the sd of the memory model's 80% prediction interval,
# cost.calibration.MEMORY_LOG_RATIO_*), extra per structural family, and within a family.
MEMORY_GLOBAL_STD = cost_calibration.interval_log_std(cost_calibration.MEMORY_LOG_RATIO_P10,
                                                      cost_calibration.MEMORY_LOG_RATIO_P90)
MEMORY_FAMILY_STD = 0.06
MEMORY_WITHIN_STD = 0.02
FAMILY = ("tp", "pp", "cp", "ep", "etp")


def _log2(v: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(v, 1.0))


def layout_features(x: LayoutArrays, predicted: Estimates, w: Workload) -> np.ndarray:
    """Features of every layout, each scaled to about [0, 1] (rows align with the layouts)."""
    a = w.model.architecture
    domain = w.cluster.nvlink_domain_gpus
    step = predicted.step_time_s
    b = predicted.breakdown_s
    comm = sum(b[k] for k in ("tp", "cp", "ep", "pp", "dp") if k in b)
    tokens = x.mbs * w.seq_length / x.cp
    if a.num_moe_experts:
        expert_tokens = tokens * a.moe_router_topk * x.ep / a.num_moe_experts
        expert_span = (x.ep * x.etp > domain).astype(float)
    else:
        expert_tokens = tokens
        expert_span = np.zeros(len(x))
    layers_per_stage = a.num_layers / x.pp
    columns = [
        _log2(x.tp) / 3, _log2(x.pp) / 4, _log2(x.vpp) / 3, _log2(x.cp) / 2, _log2(x.ep) / 7, _log2(x.etp) / 3,
        _log2(x.mbs) / 3, x.sp.astype(float), x.dist_opt.astype(float), x.recompute / 2.0,
        np.where(x.recompute == 2, x.recompute_num_layers / np.maximum(layers_per_stage, 1), 0.0),
        (x.tp * x.cp > domain).astype(float), expert_span, _log2(expert_tokens) / 16,
        b.get("bubble", 0 * step) / step, comm / step, predicted.peak_mem_gib / predicted.memory_limit_gib,
    ]
    return np.stack(columns, axis=1).astype(np.float64)


HYPER_MAX_ITERATIONS = 25  # warm-started from the last fit, a few iterations settle the hyperparameters


def _bounded_lbfgs(obj_func, initial_theta, bounds):
    """sklearn's default optimiser with an iteration cap (the default runs to convergence, ~10x slower)."""
    from scipy.optimize import minimize

    result = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                      options={"maxiter": HYPER_MAX_ITERATIONS})
    return result.x, result.fun


class ResidualGP:
    """GP regression of log(measured / prior) on layout features, with a constant mean."""

    def __init__(self, dims: int, prior_std: float = PRIOR_LOG_STD, noise_std: float = NOISE_LOG_STD) -> None:
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        self.kernel = (ConstantKernel(prior_std ** 2, (1e-4, 0.25))
                       * Matern(length_scale=np.full(dims, 0.7), length_scale_bounds=(0.15, 20.0), nu=2.5)
                       + WhiteKernel(noise_std ** 2, (1e-5, 0.01)))
        self.model = None
        self.offset = 0.0
        self.n = 0

    def fit(self, features: np.ndarray, residual: np.ndarray, optimize: bool = True) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor

        self.n = len(residual)
        # The constant mean: shrink the average residual toward 0 (the prior) while data are few.
        self.offset = float(residual.sum() / (len(residual) + (NOISE_LOG_STD / OFFSET_PRIOR_LOG_STD) ** 2))
        kernel = self.model.kernel_ if self.model is not None else self.kernel
        gp = GaussianProcessRegressor(kernel, optimizer=_bounded_lbfgs if optimize and self.n >= 4 else None,
                                      normalize_y=False, copy_X_train=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings at the length-scale bounds are expected
            gp.fit(features, residual - self.offset)
        self.model = gp

    @property
    def noise_var(self) -> float:
        if self.model is None:
            return NOISE_LOG_STD ** 2
        return float(self.model.kernel_.k2.noise_level)

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the latent residual (noise excluded) at `features`."""
        if self.model is None:
            return np.full(len(features), self.offset), np.full(len(features), PRIOR_LOG_STD)
        mean, std = self.model.predict(features, return_std=True)
        latent = np.sqrt(np.maximum(std ** 2 - self.noise_var, 1e-8))
        return mean + self.offset, latent


@dataclass
class MemoryFeasibility:
    """P(layout fits) from predicted peaks, measured peaks and OOMs (see the module docstring)."""

    predicted_gib: np.ndarray
    family: np.ndarray
    limit_gib: float
    global_std: float = MEMORY_GLOBAL_STD
    observations: list[tuple[int, float]] = field(default_factory=list)  # (layout, log ratio)
    _mean: np.ndarray | None = None
    _std: np.ndarray | None = None
    _p_fit: dict[float, np.ndarray] = field(default_factory=dict)  # by headroom, until the next observation

    def observe(self, i: int, peak_gib: float | None, oom: bool) -> None:
        predicted = float(self.predicted_gib[i])
        if oom:  # censored: it needed at least the GPU's memory; placed a little above the bound
            ratio = max(self.limit_gib, peak_gib or 0.0) / predicted * 1.03
        elif peak_gib and math.isfinite(peak_gib) and peak_gib > 0:
            ratio = peak_gib / predicted
        else:
            return
        self.observations.append((i, math.log(ratio)))
        self._mean = None
        self._p_fit = {}

    def _solve(self) -> None:
        n_layouts = len(self.predicted_gib)
        if not self.observations:
            self._mean = np.zeros(n_layouts)
            self._std = np.full(n_layouts, math.hypot(self.global_std, MEMORY_FAMILY_STD, MEMORY_WITHIN_STD))
            return
        rows = np.array([i for i, _ in self.observations])
        y = np.array([r for _, r in self.observations])
        families, column = np.unique(self.family[rows], return_inverse=True)
        k = len(families)
        design = np.zeros((len(rows), 1 + k))
        design[:, 0] = 1.0
        design[np.arange(len(rows)), 1 + column] = 1.0
        prior_precision = np.diag([1 / self.global_std ** 2] + [1 / MEMORY_FAMILY_STD ** 2] * k)
        noise = MEMORY_WITHIN_STD ** 2
        cov = np.linalg.inv(prior_precision + design.T @ design / noise)
        coef = cov @ design.T @ y / noise
        lookup = np.full(int(self.family.max()) + 1, -1)
        lookup[families] = np.arange(k)
        col = lookup[self.family]
        known = col >= 0
        mean = np.full(n_layouts, coef[0])
        var = np.full(n_layouts, cov[0, 0] + MEMORY_FAMILY_STD ** 2)
        c = col[known] + 1
        mean[known] += coef[c]
        var[known] = cov[0, 0] + cov[c, c] + 2 * cov[0, c]
        self._mean, self._std = mean, np.sqrt(var + noise)

    def log_ratio(self) -> tuple[np.ndarray, np.ndarray]:
        if self._mean is None:
            self._solve()
        return self._mean, self._std

    def expected_peak_gib(self) -> np.ndarray:
        mean, _ = self.log_ratio()
        return self.predicted_gib * np.exp(mean)

    def p_fit(self, headroom_gib: float = 0.0) -> np.ndarray:
        from scipy.special import ndtr

        if headroom_gib not in self._p_fit:
            mean, std = self.log_ratio()
            margin = np.log(max(self.limit_gib - headroom_gib, 1e-9) / self.predicted_gib) - mean
            self._p_fit[headroom_gib] = ndtr(margin / std)
        return self._p_fit[headroom_gib]
