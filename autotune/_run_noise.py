"""Run-to-run noise of repeated runs, and the rule that tells a straggler from noise.

The search (controller/surrogate.py, controller/state.py), the recommendation and the leaderboard
(controller/recommend.py) and the replay backend (backends/replay.py, merging a table's repeated rows)
judge a layout's repeated runs by this one rule, so a replayed table of a study's runs reads like the study.
Pure statistics on log throughputs: no import from the controller or a backend.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

# Run-to-run noise of a short profiling run (log scale, 1 sd) before any repeat measures it.
NOISE_LOG_STD = 0.03


def run_noise_log_std(runs_per_layout) -> float:
    """Run-to-run noise (log sd) pooled over the layouts measured more than once (each item: the log
    throughputs of one layout's runs), shrunk toward NOISE_LOG_STD as if it were three repeats, and
    leaving out stragglers (run_noise_and_stragglers): one run on a slow node must not widen every
    layout's uncertainty, turn every layout into a close contender, or loosen the pooling's bound."""
    return run_noise_and_stragglers(runs_per_layout)[0]


def straggler_runs(runs_per_layout, max_stragglers: int | None = None) -> list[list[int]]:
    """Per layout (in the order given), the positions of its runs left out as stragglers
    (run_noise_and_stragglers)."""
    return run_noise_and_stragglers(runs_per_layout, max_stragglers)[1]


def pooled_noise_log_std(runs_per_layout) -> float:
    """The run noise pooled over every run given, none left out: for runs whose stragglers were already
    taken out (recommend.run_noise, from recommend.layout_results' own decision)."""
    groups = [np.asarray(r, dtype=float) for r in runs_per_layout if len(r) > 1]
    return _noise_sd(float(sum(_squares(g) for g in groups)), sum(len(g) - 1 for g in groups))


def run_noise_and_stragglers(runs_per_layout, max_stragglers: int | None = None) -> tuple[float, list[list[int]]]:
    """The run noise (run_noise_log_std) and, per layout in the order given, the positions of its runs left
    out as stragglers (_robust_noise). Of a layout measured twice whose runs disagree, both are left out
    (one of them strayed; two runs cannot say which); a layout measured once has none."""
    runs = [np.asarray(r, dtype=float) for r in runs_per_layout]
    repeated = [i for i, r in enumerate(runs) if len(r) > 1]
    noise, left_out = _robust_noise([runs[i] for i in repeated], max_stragglers or STRAGGLER_MAX)
    out: list[list[int]] = [[] for _ in runs]
    for i, positions in zip(repeated, left_out):
        out[i] = positions
    return noise, out


# A straggler is a run that a slow node, a throttled GPU or a stalled file system made slower (or a
# mis-measured one faster) than run-to-run noise explains. Which runs are stragglers is decided by which
# explanation of the repeated runs is more likely (_robust_noise): all runs normal, or the others normal
# and these stragglers, each straggler a priori STRAGGLER_RATE likely and anywhere within a factor e of its
# layout's value (log density 1/2), the noise's variance integrated over its prior (_split_score).
# Simulated (1,200 studies of 1-11 layouts run 2-3 times, normal noise of 2-10%): 0.15% of runs left out;
# a run 30% off among its layout's three runs of 3% noise (0-5 other layouts run twice) found 80% of the
# time, 15% off 3% (on three runs it is hard to tell from noise); where the noise really is 20% and only
# two layouts ran twice, 13% of studies call one pair disputed (three layouts of three runs: 7%). The +-5%
# uniform noise of benchmarks/search_quality.py (sd 2.9%, at most 2.3 sd from a layout's median) never
# loses a run: its figures are the plain estimate's.
STRAGGLER_RATE = 0.01
_STRAGGLER_LOG_DENSITY = math.log(STRAGGLER_RATE * 0.5)
STRAGGLER_MAX = 10  # the most extreme runs weighed as stragglers (the splits weighed: one per threshold)
_NOISE_PRIOR_DOF = 3  # NOISE_LOG_STD counts as this many repeats (a scaled inverse chi-square prior)


def _noise_sd(squares: float, dof: int) -> float:
    return math.sqrt((squares + _NOISE_PRIOR_DOF * NOISE_LOG_STD ** 2) / (dof + _NOISE_PRIOR_DOF))


def _split_score(squares: float, dof: int, stragglers: int, disputed: int = 0) -> float:
    """The log probability of a split into kept runs and stragglers: the kept runs' deviations from their
    layouts' means (`squares` over `dof` degrees of freedom: the means integrated out) under normal noise
    whose variance has the scaled inverse chi-square prior of NOISE_LOG_STD over _NOISE_PRIOR_DOF,
    integrated out too (a Student-t marginal: with few repeats the prior is not taken as known), and each
    straggler's density; a disputed pair holds one straggler, either of its two runs."""
    nu, scale = _NOISE_PRIOR_DOF, _NOISE_PRIOR_DOF * NOISE_LOG_STD ** 2
    marginal = (math.lgamma((nu + dof) / 2) - math.lgamma(nu / 2) + nu / 2 * math.log(scale)
                - (nu + dof) / 2 * math.log(scale + squares) - dof / 2 * math.log(math.pi))
    return marginal + stragglers * _STRAGGLER_LOG_DENSITY + disputed * math.log(2)


def _squares(runs: np.ndarray) -> float:
    return float(np.sum((runs - np.mean(runs)) ** 2))


def _robust_noise(groups: list[np.ndarray], max_stragglers: int = STRAGGLER_MAX) -> tuple[float, list[list[int]]]:
    """The pooled run noise over `groups` (each a repeated layout's log throughputs) and, per group, the
    positions of the runs left out as stragglers.

    The splits weighed are nested: leave out every run at least t from its layout's median, for each t
    among the `max_stragglers` largest such distances, and none; the most likely split (_split_score) wins.
    Stragglers stay a minority of their layout's runs (of three runs one, of five two: the median must be
    a kept run's); a pair's runs are equally far from their mean, so a pair that disagrees is left out
    whole. Where no split beats keeping every run, the figure is the plain pooled estimate, to the bit.
    Trimming at 4 sd of the plain estimate would not do: one straggler inflates it enough to hide inside
    its own 4 sd (runs [0, 0, -36%]: 13%); trimming from the prior's 3% would not either: on a cluster
    whose noise really is 20%, it would keep the runs that happen to agree and call the rest stragglers.
    The likelihood tells the two apart: a lone far run among close ones is a straggler, a wide spread of
    many runs is noise. Each split is scored from per-layout sums (a study asks at every proposal)."""
    squares = [_squares(g) for g in groups]
    plain_squares, plain_dof = float(sum(squares)), sum(len(g) - 1 for g in groups)
    plain = (_noise_sd(plain_squares, plain_dof), [[] for _ in groups])
    # the runs that may be left out: (distance from the layout's median, layout, position; -1: a whole pair)
    candidates = []
    for k, g in enumerate(groups):
        values = g.tolist()
        if len(values) == 2:  # a pair: both runs as far from their mean, left out together
            candidates.append((abs(values[0] - values[1]) / 2, k, -1))
            continue
        middle = statistics.median(values)
        far = sorted(range(len(values)), key=lambda j: -abs(values[j] - middle))[:(len(values) - 1) // 2]
        candidates.extend((abs(values[j] - middle), k, j) for j in far)
    thresholds = sorted({d for d, _, _ in candidates}, reverse=True)[:max_stragglers]
    if not thresholds:
        return plain
    # per layout with a run that may be left out, farthest first, what leaving out its first r does to the
    # squares, the degrees of freedom and the stragglers (computed once; each split adds them up)
    by_layout: dict[int, list[tuple[float, int]]] = {}
    for d, k, j in sorted(candidates, key=lambda c: -c[0]):
        if d >= thresholds[-1]:
            by_layout.setdefault(k, []).append((d, j))
    effect: dict[int, list[tuple[float, int, int]]] = {}
    for k, runs in by_layout.items():
        if runs[0][1] == -1:  # a disputed pair: its squares and degree of freedom go, one straggler
            effect[k] = [(0.0, 0, 0), (-squares[k], -1, 1)]
            continue
        effect[k] = [(0.0, 0, 0)] + [(_squares(np.delete(groups[k], [j for _, j in runs[:r]])) - squares[k], -r, r)
                                     for r in range(1, len(runs) + 1)]
    best_score, best = _split_score(plain_squares, plain_dof, 0), None
    for t in thresholds:
        split_squares, dof, stragglers, disputed = plain_squares, plain_dof, 0, 0
        for k, runs in by_layout.items():
            r = sum(d >= t for d, _ in runs)
            split_squares += effect[k][r][0]
            dof += effect[k][r][1]
            stragglers += effect[k][r][2]
            disputed += r > 0 and runs[0][1] == -1
        score = _split_score(max(split_squares, 0.0), dof, stragglers, disputed)
        if score > best_score:
            best_score, best = score, (max(split_squares, 0.0), dof, t)
    if best is None:
        return plain
    split_squares, dof, t = best
    left_out = [[] for _ in groups]
    for k, runs in by_layout.items():
        chosen = [j for d, j in runs if d >= t]
        left_out[k] = list(range(len(groups[k]))) if chosen == [-1] else sorted(chosen)
    return _noise_sd(split_squares, dof), left_out
