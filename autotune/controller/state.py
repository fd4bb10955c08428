"""What the controller knows during a study: the legal set, the model's prior, and the measurements.

The cost model ranks every legal layout once (vectorised). Measurements then correct it
(controller/surrogate.py):
- physics: the step-time model's terms are rescaled to the measured step times
  (controller/physics.py), which re-ranks every layout, interactions included;
- speed: a Gaussian process on log(measured / calibrated prediction) over the knob values (one
  measurement moves every layout sharing a knob value or a pair of values with it), the calibrated
  cost model as its mean; repeated runs of one layout are kept apart (they measure the noise);
- memory: the probability that each layout fits, from predicted and measured peaks and OOMs;
- the OOM frontier: a measured OOM makes every layout that needs at least as much memory (same
  family or smaller TP/PP/CP/EP/ETP, equal VPP, larger micro-batch, weaker recompute, no
  distributed optimizer where the OOM had it, no SP where it had it) infeasible without a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autotune.config import RECOMPUTE_CODES, LayoutConfig, Workload
from autotune.controller.physics import PhysicsCalibration, trace_groups
from autotune.controller.surrogate import FAMILY, KNOB_VALUE_MIN_LOG_STD, MemoryFeasibility, ResidualGP
from autotune.cost import Estimates, LayoutArrays, estimate_many

P_FIT_CANDIDATE = 0.5  # a layout is a candidate for model-free strategies when it fits with this probability
P_FIT_REJECT = 0.05  # below this a proposal is rejected as predicted OOM without a run
# Hyperparameters of the GP are re-optimised on every new measurement up to this many, then on
# every OPTIMIZE_EVERY-th (they settle; the fit with fixed hyperparameters costs ~1 ms).
MIN_RUNS_TO_CALIBRATE = 2  # one run only moves the GP's constant mean
OPTIMIZE_ALWAYS_UP_TO = 12
OPTIMIZE_EVERY = 4
# the search GP gives each pair of knobs its own variance (surrogate's module doc: chosen on the tuning seeds)
PER_PAIR = True


def _codes(columns: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """An integer id per distinct row of the stacked columns, and how many ids there are."""
    _, ids = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    return ids, int(ids.max()) + 1 if ids.size else 0


def knob_codes_of(x: LayoutArrays) -> np.ndarray:
    """One integer column per layout knob (recompute's kind, method and depth as one code)."""
    # depth below 1000 keeps the recompute codes distinct
    variant = (x.recompute.astype(np.int64) * 1_000_000 + x.recompute_block.astype(np.int64) * 1000
               + x.recompute_num_layers)
    return np.stack([x.tp, x.pp, x.vpp, x.cp, x.ep, x.etp, x.sp, x.mbs, variant, x.dist_opt], axis=1).astype(np.int32)


def varying_mask(codes: np.ndarray) -> np.ndarray:
    """Which columns of `codes` hold more than one value (the columns varying_columns keeps)."""
    return (codes != codes[:1]).any(axis=0)


def varying_columns(codes: np.ndarray) -> np.ndarray:
    """`codes` without the columns that hold one value in every row: a knob every layout shares tells
    no two layouts apart (in the knob-cell kernel it would be a constant part the GP's offset already is)."""
    return codes[:, varying_mask(codes)]


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
    memory: MemoryFeasibility
    runs: dict[int, list[float]] = field(default_factory=dict)  # layout -> log tokens/s/GPU of each run
    # layout -> each run's measured parts of the step as the calibration takes them ({} without a trace)
    run_terms: dict[int, list[dict]] = field(default_factory=dict)
    # every outcome in arrival order (layout, "completed" | "oom" | "failed", tokens/s/GPU or None), for
    # strategies that replay them into a sampler of their own
    outcomes: list[tuple[int, str, float | None]] = field(default_factory=list)
    dispatched: int = 0  # trials of this study sent to a backend (the budget they use)
    # what the backend can answer (a replay table's keys, knob variants included); None: anything legal
    answerable: set[str] | None = None
    pending: set[int] = field(default_factory=set)  # layouts whose runs are in flight (set_pending)
    headroom_gib: float = 0.0  # the recommended layout keeps this much below the GPU's memory
    physics: PhysicsCalibration = field(default_factory=PhysicsCalibration)
    _log_prior: np.ndarray | None = None
    _breakdown: np.ndarray | None = None
    _log_tokens_per_step: np.ndarray | None = None
    _codes: np.ndarray | None = None
    _code_columns: list[np.ndarray] | None = None
    _gp_codes: np.ndarray | None = None
    _gp_values: list[np.ndarray] | None = None
    _neighbourhoods: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    _gp: ResidualGP | None = None
    _gp_runs: int = -1
    _means: dict[int, tuple[float, int]] = field(default_factory=dict)  # measured_means, for _means_at runs
    _noise: float = 0.0  # run_noise, likewise
    _means_at: int = -1
    _believed: tuple | None = None  # ((runs fitted, layouts in flight), the GP believing them): _posterior_gp
    # performance-knob variants of legal layouts (issue 16): outside the enumerated legal set, keyed by
    # config key; the knob phase (controller/knobs.py) reads them, the GP and physics do not
    variants: dict[str, LayoutConfig] = field(default_factory=dict)
    variant_runs: dict[str, list[float]] = field(default_factory=dict)  # key -> log tokens/s/GPU of each run
    variant_tried: set[str] = field(default_factory=set)
    variant_oom: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, workload: Workload, legal: list[LayoutConfig]) -> "SearchState":
        arrays = LayoutArrays.from_configs(legal)
        predicted = estimate_many(workload, arrays)
        family, _ = _codes([getattr(arrays, k) for k in FAMILY])
        memory = MemoryFeasibility(predicted.peak_mem_gib, family, workload.cluster.gpu.memory_gib)
        state = cls(workload=workload, legal=legal, predicted=predicted, arrays=arrays,
                    index={c.key(): i for i, c in enumerate(legal)}, family=family,
                    tried=np.zeros(len(legal), dtype=bool), frontier_by=np.full(len(legal), -1, dtype=np.int64),
                    memory=memory)
        state.surrogate()  # imports scikit-learn and scipy now, at start-up, not in the first proposal
        memory.z_fit()
        return state

    def mark_tried(self, key: str) -> None:
        """A layout dispatched or rejected (recorded): strategies never propose it again."""
        i = self.index.get(key)
        if i is not None:
            self.tried[i] = True
        else:
            self.variant_tried.add(key)

    # --- memory --------------------------------------------------------------------------------

    def predicted_peak_gib(self, i: int) -> float:
        """The calibrated expected peak of layout i."""
        return float(self.memory.expected_peak_gib()[i])

    def p_fit(self, headroom_gib: float = 0.0) -> np.ndarray:
        return self.memory.p_fit(headroom_gib)

    def p_fit_at(self, rows: np.ndarray, headroom_gib: float = 0.0) -> np.ndarray:
        return self.memory.p_fit_at(rows, headroom_gib)

    def fits(self, p_min: float, headroom_gib: float = 0.0) -> np.ndarray:
        """Mask of the layouts that fit (keeping `headroom_gib`) with probability >= p_min."""
        return self.memory.fits(p_min, headroom_gib)

    def record_memory(self, config: LayoutConfig, peak_gib: float | None, oom: bool) -> None:
        i = self.index.get(config.key())
        if i is not None:
            self.memory.observe(i, peak_gib, oom)
            if oom:
                self.outcomes.append((i, "oom", None))
        elif oom:
            self.variant_oom.add(config.key())

    # --- OOM frontier --------------------------------------------------------------------------

    def dominated_by(self, oom: LayoutConfig) -> np.ndarray:
        """Mask of layouts that need at least as much memory as the measured OOM `oom`."""
        x = self.arrays
        mask = ((x.tp <= oom.tp) & (x.pp <= oom.pp) & (x.cp <= oom.cp) & (x.ep <= oom.ep) & (x.etp <= oom.etp)
                & (x.vpp == oom.vpp) & (x.mbs >= oom.mbs) & (x.recompute <= RECOMPUTE_CODES[oom.recompute])
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

    # --- speed ----------------------------------------------------------------------------------

    @property
    def log_prior(self) -> np.ndarray:
        """Log throughput the (calibrated) cost model predicts for every layout."""
        if self._log_prior is None:
            self._log_prior = np.log(self.predicted.tokens_per_s_per_gpu)
        return self._log_prior

    def breakdown_matrix(self) -> np.ndarray:
        if self._breakdown is None:
            b = self.predicted.breakdown_s
            self._breakdown = np.stack([b[t] for t in self.physics.terms], axis=1)
        return self._breakdown

    def calibrate(self) -> None:
        """Fit the step-time model's per-term scales to the runs so far and re-rank every layout."""
        rows = [i for i, runs in self.runs.items() for _ in runs]
        if len(rows) < MIN_RUNS_TO_CALIBRATE:
            return
        log_tokens = np.array([r for runs in self.runs.values() for r in runs])
        raw = np.log(self.predicted.tokens_per_s_per_gpu[rows])
        measured_step_s = self.predicted.step_time_s[rows] * np.exp(raw - log_tokens)
        # each traced run's measured parts, by its place among `rows` (run_terms grows with runs, run for run)
        terms = [groups for i in self.runs for groups in self.run_terms[i]]
        traces = [(j, groups) for j, groups in enumerate(terms) if groups]
        self.physics.fit(self.breakdown_matrix()[rows], measured_step_s, traces)
        calibrated_step_s = self.physics.step_time_s(self.breakdown_matrix())
        if self._log_tokens_per_step is None:  # log(tokens/s/GPU * step s): fixed per layout, so taken once
            self._log_tokens_per_step = np.log(self.predicted.tokens_per_s_per_gpu * self.predicted.step_time_s)
        self._log_prior = self._log_tokens_per_step - np.log(calibrated_step_s)

    def knob_codes(self) -> np.ndarray:
        """One integer column per knob (recompute's three fields as one), for neighbourhoods and the GP."""
        if self._codes is None:
            self._codes = knob_codes_of(self.arrays)
        return self._codes

    def neighbours(self, centres: list[int], max_changes: int) -> np.ndarray:
        """Mask of layouts that differ from one of `centres` in at most `max_changes` knobs."""
        codes = self.knob_codes()
        if self._code_columns is None:
            # one contiguous array per knob: comparing column by column is ~10x faster than a row-major
            # (layouts x knobs) comparison summed along its short axis (~180,000 layouts at 64 GPUs)
            self._code_columns = [np.ascontiguousarray(codes[:, k]) for k in range(codes.shape[1])]
        mask = np.zeros(len(codes), dtype=bool)
        for i in centres:
            key = (i, max_changes)
            if key not in self._neighbourhoods:  # the best layouts change rarely: keep their masks
                changed = np.zeros(len(codes), dtype=np.int16)
                for column, value in zip(self._code_columns, codes[i]):
                    changed += column != value
                self._neighbourhoods[key] = changed <= max_changes
            mask |= self._neighbourhoods[key]
        return mask

    def gp_codes(self) -> np.ndarray:
        """The knob codes of the knobs that vary over the legal set (the GP's inputs): a knob with one
        value (EP on a dense model) would make every two layouts share it, a constant part of the
        kernel that the GP's offset already is."""
        if self._gp_codes is None:
            codes = varying_columns(self.knob_codes())
            if codes.shape[1] == 0:  # one legal layout (every layout knob pinned: a new-user pass found the
                # GP refusing zero inputs): one constant column, which leaves the GP its offset and noise
                codes = np.zeros((len(codes), 1), dtype=codes.dtype)
            self._gp_codes = codes
        return self._gp_codes

    def record_speed(self, config: LayoutConfig, tokens_per_s_per_gpu: float,
                     measured_terms_s: dict[str, float] | None = None) -> None:
        """A completed run; `measured_terms_s`: the parts of its step a trace measured (calibrate fits them)."""
        i = self.index.get(config.key())
        if i is not None and tokens_per_s_per_gpu > 0:
            self.runs.setdefault(i, []).append(float(np.log(tokens_per_s_per_gpu)))
            self.run_terms.setdefault(i, []).append(trace_groups(measured_terms_s))
            self.outcomes.append((i, "completed", tokens_per_s_per_gpu))
        elif i is None and tokens_per_s_per_gpu > 0 and config.perf():
            self.variants[config.key()] = config
            self.variant_runs.setdefault(config.key(), []).append(float(np.log(tokens_per_s_per_gpu)))

    def record_failure(self, config: LayoutConfig) -> None:
        i = self.index.get(config.key())
        if i is not None:
            self.outcomes.append((i, "failed", None))

    @property
    def n_runs(self) -> int:
        return sum(len(v) for v in self.runs.values())

    def surrogate(self) -> ResidualGP:
        """The GP on log(measured / predicted), refitted when measurements arrived since the last fit."""
        n = self.n_runs
        if self._gp is None:
            self._gp = ResidualGP(value_min_std=KNOB_VALUE_MIN_LOG_STD, per_pair=PER_PAIR)
        if n and n != self._gp_runs:
            self.calibrate()
            rows = [i for i, runs in self.runs.items() for _ in runs]
            residual = np.array([r for i, runs in self.runs.items() for r in runs]) - self.log_prior[rows]
            optimize = n <= OPTIMIZE_ALWAYS_UP_TO or n % OPTIMIZE_EVERY == 0
            self._gp.fit(self.gp_codes()[rows], residual, optimize=optimize)
            self._gp_runs = n
        return self._gp

    def posterior(self, rows: np.ndarray, believe_pending: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log throughput (tokens/s/GPU) at layouts `rows`; with `believe_pending`, as if
        the layouts in flight (`pending`) had measured what the GP expects of them (ResidualGP.believing)."""
        mean, std = self._posterior_gp(believe_pending).predict(self.gp_codes()[rows])
        return self.log_prior[rows] + mean, std

    def _posterior_gp(self, believe_pending: bool) -> ResidualGP:
        """The surrogate, or with `believe_pending` and runs in flight the surrogate believing them: kept
        until a run or the set in flight changes, so EI and a Thompson draw in one proposal refit it once."""
        gp = self.surrogate()
        if not (believe_pending and self.pending):
            return gp
        key = (self._gp_runs, frozenset(self.pending))
        if self._believed is None or self._believed[0] != key:
            self._believed = (key, gp.believing(self.gp_codes()[sorted(self.pending)]))
        return self._believed[1]

    def posterior_sample(self, rows: np.ndarray, rng: np.random.Generator,
                         believe_pending: bool = False) -> np.ndarray:
        """One joint draw of log throughput at layouts `rows` from the posterior (ResidualGP.sample)."""
        gp = self._posterior_gp(believe_pending)
        if self._gp_values is None:
            self._gp_values = [np.unique(column) for column in self.gp_codes().T]
        return self.log_prior[rows] + gp.sample(self.gp_codes()[rows], self._gp_values, rng)

    def set_pending(self, keys) -> None:
        """The layouts whose runs are in flight (dispatched, no outcome yet), by config key."""
        self.pending = {self.index[k] for k in keys if k in self.index}

    def measured_means(self) -> dict[int, tuple[float, int]]:
        """Per measured layout: mean log throughput over its counted runs and how many runs that mean is as
        sure as, as the recommendation counts them (recommend.LayoutResult): stragglers left out, a disputed
        pair averaged and counted once (surrogate.straggler_runs). Kept until the next run arrives."""
        self._judge_runs()
        return self._means

    def run_noise(self) -> float:
        """Run-to-run noise (log sd) of the study's runs, stragglers left out (surrogate.run_noise_log_std),
        from the same decision as measured_means; kept until the next run arrives."""
        self._judge_runs()
        return self._noise

    def _judge_runs(self) -> None:
        """One straggler decision per run count, for both measured_means and run_noise (the search asks for
        them several times per proposal)."""
        n = self.n_runs
        if self._means_at != n:
            from autotune.controller.surrogate import run_noise_and_stragglers

            self._noise, left_out = run_noise_and_stragglers(list(self.runs.values()))
            means = {}
            for (i, runs), out in zip(self.runs.items(), left_out):
                counted = [r for j, r in enumerate(runs) if j not in out] or runs
                means[i] = (float(np.mean(counted)), max(1, len(runs) - len(out)))
            self._means, self._means_at = means, n

    def recommendable(self, i: int) -> bool:
        """True unless a run of layout i peaked inside the headroom: such a layout ran, but the study
        never recommends it (controller/recommend.py), so ranking it better is worth nothing."""
        return self.memory.peaks_gib.get(i, 0.0) <= self.workload.cluster.gpu.memory_gib - self.headroom_gib

    def candidates(self, p_min: float = P_FIT_CANDIDATE) -> np.ndarray:
        """Mask of layouts still worth dispatching: untried, not OOM-dominated, and fitting with
        probability >= p_min (lowered step by step when nothing is left)."""
        open_ = ~self.tried & (self.frontier_by < 0)
        for threshold in sorted({p_min, 0.2, P_FIT_REJECT}, reverse=True):
            if threshold > p_min:
                continue
            mask = open_ & self.fits(threshold)
            if mask.any():
                return mask
        return mask
