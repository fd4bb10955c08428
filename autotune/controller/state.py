"""What the controller knows during a study: the legal set, the model's prior, and the measurements.

The cost model ranks every legal layout once (vectorised). Measurements then correct it:
- memory: per structural family (TP, PP, CP, EP, ETP) the measured/predicted peak ratio; families
  not yet measured use the largest ratio seen (a conservative calibration), and a measured OOM sets
  a lower bound (the layout needed more than the GPU has);
- speed: a ridge regression of log(measured / predicted throughput) on one-hot knob values, so
  that what one trial reveals about, say, EP=16 or MBS=4 re-ranks every unmeasured layout with it;
- the OOM frontier: a measured OOM makes every layout that needs at least as much memory (same
  family or smaller TP/PP/CP/EP/ETP, equal VPP, larger micro-batch, weaker recompute, no
  distributed optimizer where the OOM had it, no SP where it had it) infeasible without a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autotune.config import LayoutConfig, Workload
from autotune.cost import Estimates, LayoutArrays, estimate_many

FAMILY = ("tp", "pp", "cp", "ep", "etp")
UNMEASURED_MEMORY_MARGIN = 1.03  # before any measurement, keep 3% away from the memory limit
# Speed correction: log(measured / predicted) = one-hot(knob values) . w + noise. A prior of
# PRIOR_STD on each weight (model errors of about +-12% per knob value) and NOISE_STD of
# measurement noise plus what the knobs do not explain give the ridge penalty (NOISE/PRIOR)^2.
PRIOR_STD = 0.07
NOISE_STD = 0.03
RIDGE_LAMBDA = (NOISE_STD / PRIOR_STD) ** 2
UCB_POOL = 2000  # optimism is computed for this many best-by-mean candidates


def recompute_strength(config: LayoutConfig) -> int:
    """How much memory recompute saves: none 0 < selective 1 < full 2."""
    return {"none": 0, "selective": 1, "full": 2}[config.recompute]


def _codes(columns: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """An integer id per distinct row of the stacked columns, and how many ids there are."""
    _, ids = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    return ids, int(ids.max()) + 1 if ids.size else 0


def _knob_columns(x: LayoutArrays) -> list[np.ndarray]:
    """One numeric column per knob; the three recompute fields form one column (the variant)."""
    variant = x.recompute * 100 + x.recompute_block * 10 + x.recompute_num_layers
    return [x.tp, x.pp, x.vpp, x.cp, x.ep, x.etp, x.sp.astype(float), x.mbs, variant, x.dist_opt.astype(float)]


@dataclass
class SearchState:
    workload: Workload
    legal: list[LayoutConfig]
    predicted: Estimates
    arrays: LayoutArrays
    index: dict[str, int]
    family: np.ndarray  # structural family id of each layout
    tried: np.ndarray  # bool: dispatched, or rejected and recorded
    frontier_by: np.ndarray  # int: trial number whose OOM implies this layout OOMs (-1 none)
    family_memory_ratio: np.ndarray  # measured/predicted peak per family id (NaN: not measured)
    measured_speed: dict[int, float] = field(default_factory=dict)  # index -> tokens/s/GPU
    max_memory_ratio: float = UNMEASURED_MEMORY_MARGIN
    _features: np.ndarray | None = None
    _correction: np.ndarray | None = None
    _posterior: np.ndarray | None = None  # (A^T A + lambda I)^-1 of the speed correction

    @classmethod
    def build(cls, workload: Workload, legal: list[LayoutConfig]) -> "SearchState":
        arrays = LayoutArrays.from_configs(legal)
        predicted = estimate_many(workload, arrays)
        family, families = _codes([getattr(arrays, k) for k in FAMILY])
        return cls(workload=workload, legal=legal, predicted=predicted, arrays=arrays,
                   index={c.key(): i for i, c in enumerate(legal)}, family=family,
                   tried=np.zeros(len(legal), dtype=bool), frontier_by=np.full(len(legal), -1, dtype=np.int64),
                   family_memory_ratio=np.full(families, np.nan))

    # --- memory --------------------------------------------------------------------------------

    def _ratios(self, unmeasured: float | None = None) -> np.ndarray:
        """Memory ratio per layout: its family's measured ratio, else `unmeasured` (default: the largest)."""
        default = self.max_memory_ratio if unmeasured is None else unmeasured
        per_family = np.where(np.isnan(self.family_memory_ratio), default, self.family_memory_ratio)
        return per_family[self.family]

    def predicted_peak_gib(self, i: int) -> float:
        return float(self.predicted.peak_mem_gib[i] * self._ratios(self._unmeasured_ratio)[i])

    def fits_mask(self, unmeasured: float | None = None) -> np.ndarray:
        return self.predicted.peak_mem_gib * self._ratios(unmeasured) <= self.workload.cluster.gpu.memory_gib

    def record_memory(self, config: LayoutConfig, peak_gib: float | None, oom: bool) -> None:
        i = self.index.get(config.key())
        if i is None:
            return
        predicted = float(self.predicted.peak_mem_gib[i])
        if oom:
            limit = self.workload.cluster.gpu.memory_gib
            ratio = max(limit / predicted, (peak_gib or 0) / predicted) * 1.001  # a lower bound
        elif peak_gib:
            ratio = peak_gib / predicted
        else:
            return
        f = self.family[i]
        self.family_memory_ratio[f] = np.nanmax([self.family_memory_ratio[f], ratio])
        self.max_memory_ratio = float(np.nanmax([UNMEASURED_MEMORY_MARGIN, *self.family_memory_ratio]))

    # --- OOM frontier --------------------------------------------------------------------------

    def dominated_by(self, oom: LayoutConfig) -> np.ndarray:
        """Mask of layouts that need at least as much memory as the measured OOM `oom`."""
        x = self.arrays
        mask = ((x.tp <= oom.tp) & (x.pp <= oom.pp) & (x.cp <= oom.cp) & (x.ep <= oom.ep) & (x.etp <= oom.etp)
                & (x.vpp == oom.vpp) & (x.mbs >= oom.mbs) & (x.recompute <= recompute_strength(oom))
                & (x.dist_opt <= oom.dist_opt) & (x.sp <= oom.sp))
        if oom.recompute == "full":  # among full recompute, only the same method and depth compare
            same_full = (x.recompute_block == (oom.recompute_method == "block")) & \
                (x.recompute_num_layers == (oom.recompute_num_layers or 0))
            mask &= (x.recompute < 2) | same_full
        return mask

    def add_oom(self, config: LayoutConfig, trial_number: int) -> int:
        mask = self.dominated_by(config) & (self.frontier_by < 0)
        self.frontier_by[mask] = trial_number
        return int(mask.sum())

    # --- speed correction ----------------------------------------------------------------------

    def _feature_matrix(self) -> np.ndarray:
        """One-hot knob values of every layout (the regressors of the speed correction)."""
        if self._features is None:
            blocks = []
            for column in _knob_columns(self.arrays):
                _, ids = np.unique(column, return_inverse=True)
                blocks.append(np.eye(int(ids.max()) + 1, dtype=np.float32)[ids.reshape(-1)])
            self._features = np.concatenate(blocks, axis=1)
        return self._features

    def record_speed(self, config: LayoutConfig, tokens_per_s_per_gpu: float) -> None:
        i = self.index.get(config.key())
        if i is not None and tokens_per_s_per_gpu > 0:
            self.measured_speed[i] = tokens_per_s_per_gpu
            self._correction = None

    def corrected_speed(self) -> np.ndarray:
        """Predicted throughput times exp(fitted residual) for every legal layout."""
        base = self.predicted.tokens_per_s_per_gpu
        if len(self.measured_speed) < 2:
            return base
        if self._correction is None:
            features = self._feature_matrix()
            rows = np.array(list(self.measured_speed))
            residual = np.log(np.array([self.measured_speed[i] for i in rows]) / base[rows])
            offset = residual.mean()
            a = features[rows].astype(np.float64)
            self._posterior = np.linalg.inv(a.T @ a + RIDGE_LAMBDA * np.eye(a.shape[1]))
            weights = self._posterior @ (a.T @ (residual - offset))
            self._correction = features @ weights.astype(np.float32) + offset
        return base * np.exp(self._correction)

    def optimistic_best(self, open_: np.ndarray, kappa: float) -> int | None:
        """The open layout with the best upper confidence bound of its corrected speed.

        The bound adds kappa posterior standard deviations of the log-correction, so layouts whose
        knob values were rarely measured get a chance; it is computed for the UCB_POOL layouts with
        the best mean, which keeps a proposal cheap on large legal sets.
        """
        mean = np.where(open_, self.corrected_speed(), -np.inf)
        if not np.isfinite(mean).any():
            return None
        if self._posterior is None or kappa <= 0:
            return int(np.argmax(mean))
        pool = np.argsort(-mean)[:UCB_POOL]
        pool = pool[np.isfinite(mean[pool])]
        x = self._feature_matrix()[pool].astype(np.float64)
        sigma = NOISE_STD * np.sqrt(np.einsum("ij,jk,ik->i", x, self._posterior, x))
        return int(pool[np.argmax(np.log(mean[pool]) + kappa * sigma)])

    _unmeasured_ratio: float | None = None  # None: conservative (the largest measured ratio)

    def candidates(self) -> np.ndarray:
        """Mask of layouts still worth dispatching: untried, predicted to fit, not OOM-dominated.

        Unmeasured families are first judged with the largest measured memory ratio (conservative).
        When that leaves nothing, one family's large error is not evidence about all the others:
        fall back to the median measured ratio, then to the raw model.
        """
        open_ = ~self.tried & (self.frontier_by < 0)
        measured = self.family_memory_ratio[~np.isnan(self.family_memory_ratio)]
        for unmeasured in (None, float(np.median(measured)) if measured.size else None, 1.0):
            mask = open_ & self.fits_mask(unmeasured)
            if mask.any() or unmeasured == 1.0:
                self._unmeasured_ratio = unmeasured
                return mask
        return open_ & self.fits_mask(1.0)
