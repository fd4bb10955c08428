"""Which layout a study recommends: the best mean over its runs, with a memory margin.

A layout measured several times (a re-measurement of a close contender) is judged by the mean of
its runs, not by its luckiest run; its uncertainty is the standard error of that mean (or, for a
single run, the spread of its measured steps). The recommended layout keeps `headroom_gib` below
the GPU's memory: a faster layout whose measured peak is inside that margin is reported as risky
(it ran, but a longer run, another node or a fragmentation spike may push it over), not chosen.

Imports neither Optuna nor Ray: the read side (leaderboard, export, dashboard) uses it too.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from autotune.config import Workload
    from autotune.storage import Study, Trial

# Run-to-run spread of a measured peak (fragmentation, allocator caching, NCCL buffers), relative, 1 sd:
# the default headroom is two of these below the GPU's memory.
MEASURED_PEAK_REL_STD = 0.02


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
    return recommend(trials, memory_gib, _headroom_for(memory_gib) if headroom is None else float(headroom))


@dataclass(frozen=True)
class LayoutResult:
    """All completed runs of one layout."""

    trials: tuple["Trial", ...]
    mean_tokens_per_s_per_gpu: float
    sem_tokens_per_s_per_gpu: float  # standard error of the mean
    peak_mem_gib: float | None  # the largest measured peak over the runs

    @property
    def runs(self) -> int:
        return len(self.trials)

    @property
    def trial(self) -> "Trial":
        return self.trials[0]


@dataclass(frozen=True)
class Recommendation:
    best: LayoutResult
    risky: tuple[LayoutResult, ...] = field(default_factory=tuple)  # faster, but inside the headroom
    headroom_gib: float = 0.0
    runner_up: LayoutResult | None = None  # the next safe layout by screening mean
    validation: dict[str, LayoutResult] = field(default_factory=dict)  # config_key -> its validation run(s)

    @property
    def trial(self) -> "Trial":
        return self.best.trial


def _step_spread(trial: "Trial") -> float:
    """Relative sd of a single run's throughput from its measured steps' spread (0 when unknown)."""
    steps = [s for s in (trial.step_times_s or []) if s and s > 0]
    if len(steps) < 3:
        return 0.0
    steps = steps[len(steps) // 3:]  # warm-up steps are slower and would inflate the spread
    if len(steps) < 2:
        return 0.0
    return statistics.stdev(steps) / statistics.mean(steps) / math.sqrt(len(steps))


VALIDATION = "validation"  # the origin of a --validate-steps run (storage.TrialOrigin.VALIDATION)


def layout_results(trials: Iterable["Trial"], validation: bool = False) -> list[LayoutResult]:
    """Completed runs grouped by layout, best mean first: the screening runs, or (`validation`) only
    the longer validation runs of `--validate-steps`, which are reported apart."""
    groups: dict[str, list] = {}
    for t in trials:
        if t.status == "completed" and t.tokens_per_s_per_gpu and t.dispatched \
                and (t.origin == VALIDATION) == validation:
            groups.setdefault(t.config_key, []).append(t)
    results = []
    for runs in groups.values():
        values = [t.tokens_per_s_per_gpu for t in runs]
        mean = statistics.fmean(values)
        if len(values) > 1:
            sem = statistics.stdev(values) / math.sqrt(len(values))
        else:
            sem = mean * _step_spread(runs[0])
        peaks = [t.peak_mem_gib for t in runs if t.peak_mem_gib]
        results.append(LayoutResult(tuple(runs), mean, sem, max(peaks) if peaks else None))
    return sorted(results, key=lambda r: -r.mean_tokens_per_s_per_gpu)


def recommend(trials: Iterable["Trial"], memory_limit_gib: float, headroom_gib: float) -> Recommendation | None:
    """The best layout by mean throughput whose measured peak keeps the headroom (see module doc).

    When validation runs exist for several of the safe layouts, the one that validated fastest wins
    (validation runs are longer, so they decide between contenders the screening could not separate)."""
    trials = list(trials)
    results = layout_results(trials)
    if not results:
        return None
    validated = {r.trial.config_key: r for r in layout_results(trials, validation=True)}
    safe_limit = memory_limit_gib - headroom_gib
    safe = [r for r in results if r.peak_mem_gib is None or r.peak_mem_gib <= safe_limit]
    if not safe:  # every layout is inside the margin: recommend the best anyway, flagged by the caller
        return Recommendation(results[0], tuple(results[1:]), headroom_gib, None, validated)
    contenders = [r for r in safe[:2] if r.trial.config_key in validated]
    if len(contenders) == 2 and validated[contenders[1].trial.config_key].mean_tokens_per_s_per_gpu > \
            validated[contenders[0].trial.config_key].mean_tokens_per_s_per_gpu:
        safe[0], safe[1] = safe[1], safe[0]
    best = safe[0]
    risky = tuple(r for r in results if r.mean_tokens_per_s_per_gpu > best.mean_tokens_per_s_per_gpu and r not in safe)
    return Recommendation(best, risky, headroom_gib, safe[1] if len(safe) > 1 else None, validated)


def validation_choices(pick: Recommendation | None, noise_log_std: float) -> list[LayoutResult]:
    """What `--validate-steps` runs again: the recommended layout, and the runner-up when the
    screening runs cannot tell them apart (their log gap within two standard errors of the noise)."""
    if pick is None:
        return []
    chosen = [pick.best]
    runner_up = pick.runner_up
    if runner_up is not None:
        gap = math.log(pick.best.mean_tokens_per_s_per_gpu / runner_up.mean_tokens_per_s_per_gpu)
        if gap <= 2 * noise_log_std * math.sqrt(1 / pick.best.runs + 1 / runner_up.runs):
            chosen.append(runner_up)
    return chosen
