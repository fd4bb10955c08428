"""Which layout a study recommends: the best estimate over the layouts that ran, with a memory margin.

A layout is judged by an estimate that pools its own runs with the runs of the layouts that share
knob values with it, not by its luckiest run: a Gaussian process with the search's knob-cell kernel
(controller/surrogate.py), fitted to log(measured / predicted) with the cost model's prediction
stored with each trial as the prior (the uncalibrated one: the search's own prior is recalibrated
during the study and is not stored). With +-5% run-to-run noise and thirty-odd layouts run once, the
highest single measurement is mostly the luckiest draw; the pooled estimate shrinks it by what
similar layouts measured, but never further than one standard error of the run noise from the
layout's measured mean (POOL_SHIFT_SE), so a prediction cannot outvote the measurements.

Chosen on landscape seeds 5-14 of benchmarks/search_quality.py (not the reported 0-4), auto at budget
40: mean ratio over the 12 case/landscape rows 0.966 -> 0.968, better on 5 rows (qwen3_30b@16 regime
0.984 -> 0.992, prior_wrong 0.956 -> 0.965), worse on 4 (three llama3_70b@64 rows by at most 0.3
points, qwen3_30b@64 regime by 0.01): a small gain. The one-standard-error bound changed no ratio
there on qwen3_30b@16 and llama3_70b@64 and moved two qwen3_30b@64 rows (regime +0.3, prior_wrong
-0.1 points); the reported seeds are in search_quality.last.txt.

Where pooling cannot apply (a backend whose results repeat exactly, such as replay; fewer than
POOL_MIN_LAYOUTS layouts; a layout none of whose runs stored a usable prediction, such as an imported
log) the estimate is the plain mean of the layout's runs. Only layouts that ran can be recommended.

The uncertainty shown beside a throughput (RunNoise) is the run-to-run noise pooled over the layouts
run more than once (one run's sd; the standard error of a layout's mean of n runs is that over
sqrt(n)); the spread of one run's own steps is left out: it says nothing of the next run on other
nodes. The recommended layout keeps `headroom_gib` below the GPU's memory:
a layout with a better estimate whose measured peak is inside that margin is reported as risky (it
ran, but a longer run, another node or a fragmentation spike may push it over), not chosen.

Imports neither Optuna nor Ray: the read side (leaderboard, export, dashboard) uses it too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from autotune._numbers import is_positive_finite

if TYPE_CHECKING:
    from autotune.config import LayoutConfig, Workload
    from autotune.storage import Study, Trial

# Run-to-run spread of a measured peak (fragmentation, allocator caching, NCCL buffers), relative, 1 sd:
# the default headroom is two of these below the GPU's memory.
MEASURED_PEAK_REL_STD = 0.02
POOL_MIN_LAYOUTS = 3  # fewer layouts that ran: each is judged by its own runs
# above this many runs the pooling GP keeps its starting hyperparameters: fitting them costs O(runs^3) per
# step of the optimiser, and the leaderboard and dashboard recompute the recommendation on every refresh
POOL_OPTIMIZE_UP_TO = 150
# how far pooling may move a layout's estimate from its measured mean, in standard errors of that mean
POOL_SHIFT_SE = 1.0
PRIOR_RATIO_BOUND = 10.0  # a stored prediction 10x off what its run measured is no cost model's prediction
# Part of the digest of a stored pooling cache (pooled_cache_entry): raise it whenever the pooling changes
# (this module's rules or the GP's), so a store written by another version is pooled afresh, not read.
# 2: the run noise that bounds the pooling leaves stragglers out (surrogate.straggler_runs)
POOL_VERSION = 2


def default_headroom_gib(workload: "Workload") -> float:
    return _headroom_for(workload.cluster.gpu.memory_gib)


def _headroom_for(memory_gib: float) -> float:
    return round(2 * MEASURED_PEAK_REL_STD * memory_gib, 1)


def study_recommendation(trials: Iterable["Trial"], study: "Study") -> "Recommendation | None":
    """What a stored study recommends (the study's GPU and `--memory-headroom-gib`): the one answer the
    end-of-study summary, the leaderboard, the dashboard and `export` all give."""
    from autotune.catalog import get_gpu
    from autotune.controller.options import StudyOptions

    memory_gib = get_gpu(study.workload["gpu"]).memory_gib
    headroom = StudyOptions.from_stored(study.options).memory_headroom_gib
    if headroom is not None:
        try:  # a hand-edited study row ("abc", NaN): one line naming it, not a traceback (found by review)
            headroom = float(headroom)
        except (TypeError, ValueError):
            headroom = math.nan
        if not math.isfinite(headroom) or headroom < 0:
            from autotune.errors import ConfigError  # as a study naming an unknown GPU: the others still show

            raise ConfigError(f"study {study.name!r} stores memory_headroom_gib = "
                               f"{str(study.options.get('memory_headroom_gib'))[:40]!r}, not a size in GiB")
    return recommend(trials, memory_gib, _headroom_for(memory_gib) if headroom is None else headroom,
                     pooled_estimate=not backend_repeats_exactly(study.backend), pooled_cache=study.pooled_cache)


def backend_repeats_exactly(backend: str) -> bool:
    """True when the study's backend returns exactly the same result for a layout run twice (replay):
    its measurements have no noise to pool away."""
    from autotune.backends import backend_class
    from autotune.errors import ConfigError

    try:
        return backend_class(backend).repeatable_results
    except ConfigError:  # a backend of a newer autotune: judge its runs by their own means
        return True


@dataclass(frozen=True)
class LayoutResult:
    """All completed runs of one layout."""

    trials: tuple["Trial", ...]
    mean_tokens_per_s_per_gpu: float  # over its counted runs (stragglers left out)
    peak_mem_gib: float | None  # the largest measured peak over the runs
    # what the study judges it by: its runs pooled with similar layouts' (module doc); the mean when unpooled
    estimate_tokens_per_s_per_gpu: float = 0.0
    # trial numbers of its runs too far from the others to be run-to-run noise (surrogate.straggler_runs)
    stragglers: tuple[int, ...] = ()

    @property
    def runs(self) -> int:
        return len(self.trials)

    @property
    def counted(self) -> tuple["Trial", ...]:
        """The runs its mean counts: all but the stragglers; both runs of a disputed pair (one of them
        strayed, two cannot say which)."""
        return tuple(t for t in self.trials if t.number not in self.stragglers) or self.trials

    @property
    def counted_runs(self) -> int:
        """How many runs its mean is as sure as (its standard error's n): a disputed pair counts one."""
        return max(1, self.runs - len(self.stragglers))

    @property
    def trial(self) -> "Trial":
        return self.trials[0]


@dataclass(frozen=True)
class Recommendation:
    best: LayoutResult
    # would have been recommended (a better estimate) but peaked inside the headroom
    risky: tuple[LayoutResult, ...] = field(default_factory=tuple)
    headroom_gib: float = 0.0
    runner_up: LayoutResult | None = None  # the next safe layout by estimate (screening runs)
    validation: dict[str, LayoutResult] = field(default_factory=dict)  # config_key -> its validation run(s)
    # the run-to-run noise of the screening runs it was chosen from (None when the backend repeats exactly)
    noise: "RunNoise | None" = None
    # layouts with an OOM among their runs (a re-measurement, a longer validation run): never safe
    oomed: frozenset[str] = frozenset()
    safe: bool = True  # False: no layout kept the headroom, and `best` is the best of the rest, at risk
    layouts: tuple[LayoutResult, ...] = ()  # every layout's screening runs, best estimate first
    memory_gib: float | None = None  # the GPU's memory, of which the headroom is kept

    def layout_of(self, config_key: str, validation: bool = False) -> LayoutResult | None:
        """The runs of one layout as the recommendation grouped them: its screening runs (the study's and
        imported ones), or (`validation`) its longer validation runs; None when it has none."""
        if validation:
            return self.validation.get(config_key)
        return self._by_key.get(config_key)

    @functools.cached_property
    def _by_key(self) -> dict[str, LayoutResult]:
        """The layouts by key, made once (review: the leaderboard asks for each row's, 2,000 rows took 0.2 s)."""
        return {r.trial.config_key: r for r in reversed(self.layouts)}  # the first of a key wins, as next() did

    def mean_se(self, result: LayoutResult) -> float | None:
        """The standard error of a layout's mean, tokens/s/GPU (None where runs repeat exactly)."""
        return self.noise.mean_se(result.mean_tokens_per_s_per_gpu, result.counted_runs) if self.noise else None

    def trial_risk(self, trial: "Trial") -> str | None:
        """Why a trial that ran is of a layout the study does not recommend as safe, or None: an OOM in one of
        its layout's runs, its own peak inside the margin (a longer validation run can peak above the screening
        runs), or another screening run of its layout peaking there (the layout's peak is what the
        recommendation judges; named with its trial, since it is not the trial's own)."""
        if trial.config_key in self.oomed:
            return "ran out of memory in one of its runs"
        limit = None if self.memory_gib is None else self.memory_gib - self.headroom_gib
        if limit is None:
            return None
        margin = f"inside the {self.headroom_gib:g} GiB memory margin"
        if trial.peak_mem_gib is not None and trial.peak_mem_gib > limit:
            return f"peaked at {trial.peak_mem_gib:.1f} GiB, {margin}"
        result = self.layout_of(trial.config_key)
        peaks = [t for t in result.trials if t.peak_mem_gib is not None] if result is not None else []
        top = max(peaks, key=lambda t: t.peak_mem_gib, default=None)
        if top is not None and top.peak_mem_gib > limit:
            return f"peaked at {top.peak_mem_gib:.1f} GiB in its run of trial {top.number}, {margin}"
        return None

    def risk(self, result: LayoutResult) -> str:
        """Why a layout that ran is not safe: an OOM in one of its runs, or its peak inside the margin."""
        if result.trial.config_key in self.oomed:
            return "ran out of memory in one of its runs"
        if result.peak_mem_gib is None:
            return "its peak memory was not measured"
        return f"peaked at {result.peak_mem_gib:.1f} GiB, inside the {self.headroom_gib:g} GiB memory margin"

    @property
    def trial(self) -> "Trial":
        return self.best.trial


VALIDATION = "validation"  # the origin of a --validate-steps run (storage.TrialOrigin.VALIDATION)


@dataclass(frozen=True)
class RunNoise:
    """How far one run's throughput falls from its layout's (log sd, about the relative sd), pooled over
    the layouts of a study that ran more than once and shrunk toward the assumed NOISE_LOG_STD
    (surrogate.run_noise_log_std): the uncertainty the leaderboard shows beside each throughput."""

    log_std: float
    repeated_layouts: int  # layouts that ran more than once; 0: the figure is the assumption alone
    # trial numbers of the runs left out of the figure as stragglers (surrogate.straggler_runs)
    stragglers: tuple[int, ...] = ()

    def run_sd(self, tokens_per_s_per_gpu: float) -> float | None:
        """One run's sd, tokens/s/GPU (None where it overflows: a hand-edited store's 1e308 next to 1e-308)."""
        return self.mean_se(tokens_per_s_per_gpu, 1)

    def mean_se(self, tokens_per_s_per_gpu: float, runs: int) -> float | None:
        """Standard error of the mean of `runs` runs, tokens/s/GPU (None where it overflows)."""
        se = tokens_per_s_per_gpu * self.log_std / math.sqrt(max(1, runs))
        return se if math.isfinite(se) else None


def run_noise(results: list[LayoutResult]) -> RunNoise:
    """The study's run-to-run noise from its layouts' runs (RunNoise), leaving out the stragglers that
    layout_results found (one decision for the means and the noise, made once)."""
    from autotune.controller.surrogate import pooled_noise_log_std

    kept = [[math.log(t.tokens_per_s_per_gpu) for t in r.trials if t.number not in r.stragglers] for r in results]
    # the layouts the figure comes from: two runs or more kept (a disputed pair gives none)
    return RunNoise(pooled_noise_log_std(kept), sum(len(k) > 1 for k in kept),
                    tuple(sorted(n for r in results for n in r.stragglers)))


def layout_results(trials: Iterable["Trial"], validation: bool = False) -> list[LayoutResult]:
    """Completed runs grouped by layout, best mean first: the screening runs, or (`validation`) only
    the longer validation runs of `--validate-steps`, which are reported apart."""
    groups: dict[str, list] = {}
    for t in trials:
        if t.status == "completed" and t.tokens_per_s_per_gpu and t.dispatched \
                and (t.origin == VALIDATION) == validation:
            groups.setdefault(t.config_key, []).append(t)
    from autotune.controller.surrogate import straggler_runs

    # a straggler (a slow node) says nothing of its layout: its mean counts the other runs, as the run
    # noise does (run_noise)
    left_out = straggler_runs([[math.log(t.tokens_per_s_per_gpu) for t in runs] for runs in groups.values()])
    results = []
    for runs, out in zip(groups.values(), left_out):
        peaks = [t.peak_mem_gib for t in runs if t.peak_mem_gib]
        result = LayoutResult(tuple(runs), 0.0, max(peaks) if peaks else None,
                              stragglers=tuple(runs[j].number for j in out))
        values = [t.tokens_per_s_per_gpu for t in result.counted]  # the one rule of which runs a mean counts
        try:
            mean = statistics.fmean(values)
        except OverflowError:  # two runs near the float maximum (a hand-edited store): their sum overflows
            mean = math.fsum(v / len(values) for v in values)
        results.append(dataclasses.replace(result, mean_tokens_per_s_per_gpu=mean, estimate_tokens_per_s_per_gpu=mean))
    return sorted(results, key=lambda r: -r.mean_tokens_per_s_per_gpu)


def _log_prior(trial: "Trial") -> float | None:
    """log of the cost model's prediction stored with a run, when it is one a cost model could have made
    for it (a finite positive number within PRIOR_RATIO_BOUND of what the run measured); None otherwise
    (an imported log stores none; a record of another version or a tampered one may hold anything)."""
    stored = trial.predicted.get("tokens_per_s_per_gpu") if isinstance(trial.predicted, dict) else None
    if not is_positive_finite(stored):
        return None
    ratio = trial.tokens_per_s_per_gpu / stored
    return math.log(stored) if 1 / PRIOR_RATIO_BOUND <= ratio <= PRIOR_RATIO_BOUND else None


_POOLED: dict[tuple, dict[str, float]] = {}  # the last few pooled fits: the live view rebuilds every 0.25 s


def pooled(results: list[LayoutResult], stored: object = None) -> list[LayoutResult]:
    """`results` with each layout's pooled estimate (module doc), best estimate first.

    The estimate is a shrinkage of the layout's measured mean: the GP's posterior mean at the layout,
    kept within POOL_SHIFT_SE standard errors of that mean (run noise pooled from the layouts run more
    than once, shrunk toward the stated NOISE_LOG_STD: surrogate.run_noise_log_std), so a prediction can
    never outvote the measurements. Runs without a usable stored prediction (`_log_prior`) are left out
    of the fit and their layouts keep their plain means; with fewer than POOL_MIN_LAYOUTS layouts to
    pool, `results` come back unchanged.

    `stored` is the study's cache (pooled_cache_entry, as the controller stored it): used instead of a
    fit when it was computed from exactly these runs, so a reader of a finished study needs no GP (and
    does not import scikit-learn)."""
    estimates = _estimates_of(results, stored)
    if not estimates:
        return results
    out = [dataclasses.replace(r, estimate_tokens_per_s_per_gpu=estimates.get(r.trial.config_key,
                                                                               r.mean_tokens_per_s_per_gpu))
           for r in results]
    return sorted(out, key=lambda r: -r.estimate_tokens_per_s_per_gpu)


def _estimates_of(results: list[LayoutResult], stored: object = None) -> dict[str, float]:
    """The pooled estimates of `results` (config_key -> tokens/s/GPU): the study's stored ones when they are
    of exactly these runs (_stored_estimates), else a fit; kept for the next call with the same runs."""
    key = _pool_key(results)
    if key not in _POOLED:
        if len(_POOLED) >= 16:
            _POOLED.pop(next(iter(_POOLED)))
        cached = _stored_estimates(stored, results)
        _POOLED[key] = _pooled_estimates(results) if cached is None else cached
    return _POOLED[key]


def _pool_key(results: list[LayoutResult]) -> tuple:
    """What the pooled estimates depend on: every run's number, layout, throughput and stored prediction."""
    return tuple((t.number, t.config_key, t.tokens_per_s_per_gpu, repr(t.predicted))
                 for r in results for t in r.trials)


def _pool_digest(results: list[LayoutResult]) -> str:
    import hashlib

    from autotune.controller import surrogate as s  # constants only: no scikit-learn at import

    # this module's constants and the GP's that the pooling reads (some come from the cost model's
    # calibration): a recalibrated autotune pools afresh even if nobody bumps POOL_VERSION
    constants = (POOL_VERSION, POOL_MIN_LAYOUTS, POOL_OPTIMIZE_UP_TO, POOL_SHIFT_SE, PRIOR_RATIO_BOUND,
                 s.PRIOR_LOG_STD, s.OFFSET_PRIOR_LOG_STD, s.NOISE_LOG_STD, s.VARIANCE_BOUNDS, s.PAIR_BOUNDS,
                 s.PAIR_SHRINK_LOG_STD, s.HYPER_MAX_ITERATIONS, s.STRAGGLER_RATE, s.STRAGGLER_MAX)
    return hashlib.sha256(repr((constants, _pool_key(results))).encode()).hexdigest()


def pooled_cache_entry(trials: Iterable["Trial"]) -> dict:
    """`{"key": digest of the runs, "estimates": {config_key: tokens/s/GPU}}` for the study's record
    (Repository.set_pooled_cache); fits the GP unless these runs were pooled in this process already."""
    results = layout_results(trials)
    return {"key": _pool_digest(results), "estimates": _estimates_of(results)}


def _stored_estimates(stored: object, results: list[LayoutResult]) -> dict[str, float] | None:
    """The cache's estimates when it was computed from exactly `results` and holds what this pooling
    could have written: an estimate for each layout it pools and no other, each within its bound
    (POOL_SHIFT_SE standard errors of the run noise) of the layout's mean; None otherwise (no cache, stale,
    another version's, or edited by hand: the estimates are then computed)."""
    if not isinstance(stored, dict) or stored.get("key") != _pool_digest(results):
        return None
    estimates = stored.get("estimates")
    if not isinstance(estimates, dict):
        return None
    poolable = {r.trial.config_key: r for r, _, _ in _poolable(results)}
    if set(estimates) != (set(poolable) if len(poolable) >= POOL_MIN_LAYOUTS else set()):
        return None
    noise = run_noise(results).log_std
    for config_key, value in estimates.items():
        r = poolable[config_key]
        bound = POOL_SHIFT_SE * noise / math.sqrt(r.counted_runs) + 1e-9  # + float rounding of the clip
        if not is_positive_finite(value) or abs(math.log(value / r.mean_tokens_per_s_per_gpu)) > bound:
            return None
    return {str(k): float(v) for k, v in estimates.items()}


def _poolable(results: list[LayoutResult]) -> list[tuple[LayoutResult, "LayoutConfig", list[tuple["Trial", float]]]]:
    """The layouts the pooling fits, each with its parsed layout and its runs with a usable stored prediction
    (`_log_prior`) beside that prediction's log: a layout with no such run, or whose record an older or newer
    autotune wrote, keeps its plain mean."""
    from autotune.config import LayoutConfig
    from autotune.errors import ConfigError

    poolable = []
    for r in results:
        usable = [(t, lp) for t, lp in zip(r.counted, map(_log_prior, r.counted)) if lp is not None]
        if not usable:
            continue
        try:
            config = LayoutConfig.from_mapping(r.trial.config)
        except (ConfigError, TypeError, ValueError, KeyError):
            continue
        poolable.append((r, config, usable))
    return poolable


def _pooled_estimates(results: list[LayoutResult]) -> dict[str, float]:
    """config_key -> pooled estimate (tokens/s/GPU) of the layouts that can be pooled; {} when too few."""
    import numpy as np

    from autotune.controller.state import knob_codes_of, varying_columns
    from autotune.controller.surrogate import ResidualGP
    from autotune.cost import LayoutArrays

    layouts, configs, priors = [], [], []
    rows, measured = [], []  # per usable run: its layout's row and its log throughput
    for r, config, usable in _poolable(results):
        rows += [len(layouts)] * len(usable)
        measured += [math.log(t.tokens_per_s_per_gpu) for t, _ in usable]
        layouts.append(r)
        configs.append(config)
        # runs of one layout under different model versions: the mean of their predictions
        priors.append(float(np.mean([lp for _, lp in usable])))
    if len(layouts) < POOL_MIN_LAYOUTS:
        return {}
    codes = knob_codes_of(LayoutArrays.from_configs(configs))
    # performance-knob variants of one layout are different configurations: one column per knob they set
    perf = [c.perf() for c in configs]
    for name in sorted({name for p in perf for name in p}):
        values = [repr(p.get(name)) for p in perf]
        code = {v: k for k, v in enumerate(sorted(set(values)))}
        codes = np.hstack([codes, np.array([[code[v]] for v in values], dtype=np.int32)])
    codes = varying_columns(codes)
    rows, measured = np.array(rows), np.array(measured)
    prior = np.array(priors)
    gp = ResidualGP()
    try:
        gp.fit(codes[rows], measured - prior[rows], optimize=len(rows) <= POOL_OPTIMIZE_UP_TO)
        mean, _ = gp.predict(codes)
    except (np.linalg.LinAlgError, ValueError):
        return {}
    log_mean = np.log([r.mean_tokens_per_s_per_gpu for r in layouts])
    noise = run_noise(results).log_std
    bound = POOL_SHIFT_SE * noise / np.sqrt([r.counted_runs for r in layouts])
    estimate = np.clip(prior + mean, log_mean - bound, log_mean + bound)
    return {r.trial.config_key: float(e) for r, e in zip(layouts, np.exp(estimate))}


def recommend(trials: Iterable["Trial"], memory_limit_gib: float, headroom_gib: float,
              pooled_estimate: bool = True, pooled_cache: object = None) -> Recommendation | None:
    """The best layout by estimated throughput (pooled when `pooled_estimate`, see the module doc)
    whose measured peak keeps the headroom.

    When validation runs exist for several of the safe layouts, the one that validated fastest wins
    (validation runs are longer, so they decide between contenders the screening could not separate).
    A layout with an OOM among its runs is not safe, whatever its completed runs peaked at."""
    trials = list(trials)
    results = layout_results(trials)
    if not results:
        return None
    noise = run_noise(results) if pooled_estimate else None  # no noise to pool or show where runs repeat
    if pooled_estimate:
        results = pooled(results, pooled_cache)
    validated = {r.trial.config_key: r for r in layout_results(trials, validation=True)}
    safe_limit = memory_limit_gib - headroom_gib
    # a layout that ran out of memory in any run (a re-measurement, a longer validation run) does not fit
    # reliably, whatever its completed runs peaked at: not recommended, shown as risky
    oomed = frozenset(t.config_key for t in trials if t.status == "oom")
    safe = [r for r in results if r.trial.config_key not in oomed
            and (r.peak_mem_gib is None or r.peak_mem_gib <= safe_limit)]
    if not safe:  # no layout kept the margin: the best that never ran out of memory (else the best), flagged
        best = next((r for r in results if r.trial.config_key not in oomed), results[0])
        risky = tuple(r for r in results if r is not best and r.estimate_tokens_per_s_per_gpu
                      > best.estimate_tokens_per_s_per_gpu)
        return Recommendation(best, risky, headroom_gib, None, validated, noise, oomed, safe=False,
                              layouts=tuple(results), memory_gib=memory_limit_gib)
    contenders = [r for r in safe[:2] if r.trial.config_key in validated]
    if len(contenders) == 2 and validated[contenders[1].trial.config_key].mean_tokens_per_s_per_gpu > \
            validated[contenders[0].trial.config_key].mean_tokens_per_s_per_gpu:
        safe[0], safe[1] = safe[1], safe[0]
    best = safe[0]
    risky = tuple(r for r in results if r.estimate_tokens_per_s_per_gpu > best.estimate_tokens_per_s_per_gpu
                  and r not in safe)
    return Recommendation(best, risky, headroom_gib, safe[1] if len(safe) > 1 else None, validated, noise, oomed,
                          layouts=tuple(results), memory_gib=memory_limit_gib)


def validation_choices(pick: Recommendation | None, noise_log_std: float) -> list[LayoutResult]:
    """What `--validate-steps` runs again: the recommended layout, and the runner-up when the
    screening runs cannot tell them apart (their log gap within two standard errors of the noise)."""
    if pick is None:
        return []
    chosen = [pick.best]
    runner_up = pick.runner_up
    if runner_up is not None:
        gap = math.log(pick.best.estimate_tokens_per_s_per_gpu / runner_up.estimate_tokens_per_s_per_gpu)
        if gap <= 2 * noise_log_std * math.sqrt(1 / pick.best.counted_runs + 1 / runner_up.counted_runs):
            chosen.append(runner_up)
    return chosen
