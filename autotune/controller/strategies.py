"""Proposal strategies: which layout to try next.

Contract (every strategy): `propose(state)` returns the next layout to dispatch as a Proposal, or
None when it has nothing left. A proposal is a legal layout of the state's legal set that is open
(untried), except a "remeasure" proposal, which names a measured layout to run again. Strategies
read the SearchState only; they never touch autotune's storage, the study of record or Ray (the
controller does). Strategies built on an Optuna sampler keep a private in-memory Optuna study.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from autotune.config import LayoutConfig
from autotune.controller.notes import BASELINE, EXPLORE, GRID, RANDOM, REFINE, REMEASURE, THOMPSON
from autotune.controller.state import SearchState
from autotune.errors import ConfigError

INIT_SHARE = 0.15  # of the budget spent on the initial design (distinct structural families)
INIT_MIN, INIT_MAX = 2, 6
P_FIT_MIN = 0.5  # layouts fitting with a lower probability are not worth a run
P_FIT_EXPLORE = 0.8  # the initial design takes only layouts that surely fit
POOL_TOP, POOL_RANDOM, POOL_KEEP, POOL_LOCAL = 1000, 1000, 500, 3000
TRUST_CENTRES, TRUST_CHANGES = 5, 3  # neighbourhoods of the best measured layouts: knobs changed at most
GLOBAL_GAP = 0.10  # outside them, a candidate's posterior mean must be within this (log) of the incumbent
REMEASURE_SHARE = 0.15  # last share of the budget in which close contenders may be measured again
REMEASURE_MIN_BUDGET = 8
REMEASURE_CONTENDERS = 4
REMEASURE_MAX_RUNS = 3
# with runs in flight (several slots), score layouts as if those runs had measured the GP's expectation
# (kriging believer: SearchState.posterior), so a batch spreads instead of stacking near-copies
BELIEVE_PENDING = True
# every THOMPSON_EVERY-th proposal after the initial design is a Thompson sample (module doc of AutoStrategy),
# drawn over at most THOMPSON_ROWS open layouts (a random subset beyond that: a draw costs O(rows D^2))
THOMPSON_EVERY = 3
THOMPSON_ROWS = 20000
MAX_SUGGESTIONS = 60  # Optuna suggestions tried per proposal before a random legal layout stands in


@dataclass(frozen=True)
class Proposal:
    config: LayoutConfig
    note: str  # why it was chosen: a name from controller/notes.py, or an Optuna sampler strategy's own name


class Strategy(ABC):
    name = "base"

    def __init__(self, budget: int, seed: int | None, baseline: LayoutConfig | None = None,
                 space=None) -> None:
        self.budget = budget
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.baseline = baseline
        self.space = space  # the SearchSpace (knob domains), for strategies that sample knobs
        # False when the backend's results repeat exactly (replay): a second run would tell nothing
        self.remeasure = True

    @abstractmethod
    def propose(self, state: SearchState) -> Proposal | None:
        """The next layout to dispatch, or None when none is left (see the module contract)."""

    def _baseline(self, state: SearchState) -> Proposal | None:
        """The recipe's own layout first, when it is legal here and predicted to fit."""
        if self.baseline is None:
            return None
        i = state.index.get(self.baseline.key())
        if i is not None and not state.tried[i] and state.candidates()[i]:
            return Proposal(self.baseline, BASELINE)
        return None


class AutoStrategy(Strategy):
    """Model-guided Bayesian optimisation over the legal set.

    1. the recipe's own layout (the baseline);
    2. an initial design: the best-predicted layout of each untried structural family (TP, PP, CP,
       EP, ETP) that surely fits, for INIT_SHARE of the budget;
    3. constrained expected improvement: the GP posterior of log throughput (cost model as mean,
       controller/surrogate.py) gives EI over the best posterior mean measured so far, times the
       probability that the layout fits; layouts fitting with probability < P_FIT_MIN are skipped;
       with runs in flight (several slots), the posterior believes them measured at its own mean
       (BELIEVE_PENDING), so proposals made before their results spread instead of copying them;
       every THOMPSON_EVERY-th of these proposals is instead a Thompson sample (Thompson 1933; Russo et
       al. 2018): the best open layout of one joint draw from the same posterior (SearchState.
       posterior_sample), among those likely to keep the headroom. EI alone stays near the incumbent
       (GLOBAL_GAP) and spends its runs on the region the prior likes; a draw goes wherever the
       posterior still gives a fair chance of the optimum, as often as that chance says. Chosen on
       landscape seeds 5-24 of benchmarks/search_quality.py (not the reported 0-4), auto @40, mean ratio
       over the 12 rows (search_quality.last.txt): EI alone 0.9739, every third proposal a draw 0.9777
       (up on both halves of the seeds: 5-14 0.9783 -> 0.9822, 15-24 0.9694 -> 0.9732), every second
       0.9722; the draw's rows are a random subset plus the layouts EI scored that round (without the
       latter, qwen3_30b@64 lost 0.8-1.0 points on two rows: a random 20,000 of 140,000 open layouts
       rarely holds the best layouts' neighbourhood);
    4. in the last REMEASURE_SHARE of the budget, a close contender (its gap within the run-to-run
       noise) is measured again when that run is worth more than a new layout: its knowledge gradient
       (remeasure_value) against the largest knowledge gradient of one noisy run of a scored new
       layout (weighted like the EI by the chance it keeps the headroom), and the first contender
       always (the run noise is a guess until a layout has run twice). A search still far from the
       optimum keeps searching; one that has settled makes sure the winner is not the luckiest run.
       A layout whose measured peak is inside the headroom is no contender: it is never recommended.
       The new layout weighed is the best by knowledge gradient, the one proposed the best by EI
       (proposing the former measured the same on the tuning seeds: 0.9711 against 0.9712).
    """

    name = "auto"

    def propose(self, state: SearchState) -> Proposal | None:
        first = self._baseline(state)
        if first is not None:
            return first
        again = self._remeasure(state)
        open_ = state.candidates(P_FIT_MIN)
        if not open_.any():
            return None if again is None else Proposal(state.legal[again[0]], REMEASURE)
        if state.dispatched < self._initial_design_size():
            i = self._best_new_family(state, open_ & state.fits(P_FIT_EXPLORE))
            if i is not None:
                return Proposal(state.legal[i], EXPLORE)
        # A run spent again on a contender is a run not spent on a new layout: measure again only when
        # that is worth more (both values are knowledge gradients: the expected gain in the true log
        # throughput of the layout chosen in the end). With the search still far from the optimum, new
        # layouts win; once it has settled, the contenders do. Until one layout has run twice the run
        # noise is only the prior's guess (NOISE_LOG_STD), so the first contender runs again regardless.
        noise_known = any(len(runs) > 1 for runs in state.runs.values())
        # the scoring runs every time (it keeps the pool's state and draws from the rng); the new layouts'
        # value is weighed only when a contender competes for the run with a known noise
        weigh = again is not None and noise_known
        i, gain = self._expected_improvement(state, open_, weigh=weigh)
        if again is not None and (not noise_known or again[1] >= gain):
            return Proposal(state.legal[again[0]], REMEASURE)
        if THOMPSON_EVERY and (state.dispatched - self._initial_design_size()) % THOMPSON_EVERY == 0:
            j = self._thompson(state, open_)
            if j is not None:
                return Proposal(state.legal[j], THOMPSON)
        return Proposal(state.legal[i], REFINE)

    def _thompson(self, state: SearchState, open_: np.ndarray) -> int | None:
        """The best open layout of one draw from the posterior, among those likely to keep the headroom:
        it runs where the posterior gives a fair chance of being the optimum, however far from the
        incumbent (EI's GLOBAL_GAP never goes there), and as often as that chance says."""
        eligible = open_ & state.fits(P_FIT_MIN, state.headroom_gib)
        rows = np.flatnonzero(eligible)
        if rows.size == 0:
            return None
        if rows.size > THOMPSON_ROWS:
            # a random subset, plus the layouts EI scored this round (the neighbourhoods of the best
            # measured layouts, the prior's best), which a random subset of a large legal set would miss
            scored = self._scored[eligible[self._scored]]
            rows = np.union1d(self.rng.choice(rows, THOMPSON_ROWS, replace=False), scored)
        draw = state.posterior_sample(rows, self.rng, believe_pending=BELIEVE_PENDING)
        return int(rows[int(np.argmax(draw))])

    def _initial_design_size(self) -> int:
        return 1 + min(INIT_MAX, max(INIT_MIN, round(INIT_SHARE * self.budget)))

    @staticmethod
    def _best_new_family(state: SearchState, open_: np.ndarray) -> int | None:
        """The best-predicted open layout of a structural family no trial has touched yet."""
        new_family = ~np.isin(state.family, state.family[state.tried])
        masked = np.where(open_ & new_family, state.log_prior, -np.inf)
        i = int(np.argmax(masked))
        return i if np.isfinite(masked[i]) else None

    def _pool(self, state: SearchState, open_: np.ndarray) -> np.ndarray:
        """Layouts scored this round: the neighbourhood of the best measured layouts (a trust region:
        knobs interact, so the best layouts are found by changing a good layout a little), the
        prior's best, a random sample, and last round's best."""
        measured = sorted(state.measured_means().items(), key=lambda kv: -kv[1][0])
        local = np.flatnonzero(open_ & state.neighbours([i for i, _ in measured[:TRUST_CENTRES]], TRUST_CHANGES))
        rows = np.flatnonzero(open_)
        if rows.size <= POOL_TOP + POOL_RANDOM:
            return rows, np.isin(rows, local)
        top = rows[np.argpartition(-state.log_prior[rows], POOL_TOP)[:POOL_TOP]]
        sample = self.rng.choice(rows, POOL_RANDOM, replace=False)
        kept = self._kept[open_[self._kept]] if self._kept is not None else np.array([], dtype=np.int64)
        if local.size > POOL_LOCAL:
            local = self.rng.choice(local, POOL_LOCAL, replace=False)
        pool = np.unique(np.concatenate([local, top, sample, kept]))
        return pool, np.isin(pool, local)

    _kept: np.ndarray | None = None
    _scored = np.array([], dtype=np.int64)  # the layouts the last EI round scored

    def _expected_improvement(self, state: SearchState, open_: np.ndarray, weigh: bool = True) -> tuple[int, float]:
        """The open layout with the best constrained EI, and (with `weigh`; 0.0 without) what one run of
        the best new layout is worth: its knowledge gradient, to weigh against measuring a contender again."""
        pool, local = self._pool(state, open_)
        self._scored = pool
        measured = np.array(list(state.runs), dtype=np.int64)
        # one posterior for both (believing the runs in flight refits the GP once per call)
        mean, std = state.posterior(np.concatenate([pool, measured]), believe_pending=BELIEVE_PENDING)
        incumbent = float(np.max(mean[len(pool):] if measured.size else mean))
        mean, std = mean[:len(pool)], std[:len(pool)]
        # EI is weighted by the chance the layout keeps the headroom (only such a layout can be
        # recommended); the candidate threshold of `open_` is about running out of memory at all
        keeps_headroom = state.p_fit_at(pool, state.headroom_gib)
        score = expected_improvement(mean, std, incumbent) * keeps_headroom
        # Far from every good layout, only candidates whose mean is close to the incumbent are worth
        # a run: with 40 runs, a bet on a region the posterior expects to be much slower rarely pays.
        far = ~local & (mean < incumbent - GLOBAL_GAP)
        score[far] = 0.0
        order = np.argsort(-score)
        self._kept = pool[order[:POOL_KEEP]]
        if not weigh:
            return int(pool[order[0]]), 0.0
        # what one (noisy) run of a new layout is worth, on the same footing as remeasure_value: its
        # knowledge gradient, the posterior mean moving by sd std**2 / sqrt(std**2 + noise**2) (Frazier et
        # al. 2008); EI assumes the run reveals the layout's value exactly and overrates a near-known one
        noise = state.run_noise()
        moved = std ** 2 / np.sqrt(std ** 2 + noise ** 2)
        value = expected_improvement(mean, moved, incumbent) * keeps_headroom
        value[far] = 0.0
        return int(pool[order[0]]), float(value.max())

    def _remeasure(self, state: SearchState) -> tuple[int, float] | None:
        """A close contender to measure again in the budget's last REMEASURE_SHARE, with the value of
        that run (remeasure_value); None outside that share or when no contender is close."""
        if self.budget < REMEASURE_MIN_BUDGET or not self.remeasure:
            return None
        remaining = self.budget - state.dispatched
        if remaining <= 0 or remaining > max(1, round(REMEASURE_SHARE * self.budget)):
            return None
        noise = state.run_noise()
        # a layout that peaked inside the headroom is never recommended: ranking it better is worth nothing
        means = {i: m for i, m in state.measured_means().items() if state.recommendable(i)}
        i = remeasure_choice(means, noise)
        return None if i is None else (i, remeasure_value(means, i, noise))


def expected_improvement(mean: np.ndarray, std: np.ndarray, incumbent: float) -> np.ndarray:
    """EI of log throughput over `incumbent` (closed form for a Gaussian posterior)."""
    from scipy.special import ndtr

    std = np.maximum(std, 1e-9)
    z = (mean - incumbent) / std
    return std * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) + (mean - incumbent) * ndtr(z)


def remeasure_choice(means: dict[int, tuple[float, int]], noise_std: float) -> int | None:
    """The contender to measure again: among the best layouts whose gap to the best mean is within
    two standard errors of the noise, the one with the fewest runs (best first on ties); None when
    the best is clear or every contender already has REMEASURE_MAX_RUNS runs."""
    if len(means) < 2:
        return None
    ranked = sorted(means, key=lambda i: -means[i][0])
    best_mean, best_n = means[ranked[0]]
    contenders = [i for i in ranked[:REMEASURE_CONTENDERS]
                  if best_mean - means[i][0] <= 2 * noise_std * math.sqrt(1 / means[i][1] + 1 / best_n)]
    if len(contenders) < 2:
        return None
    pick = min(contenders, key=lambda i: (means[i][1], -means[i][0]))
    return None if means[pick][1] >= REMEASURE_MAX_RUNS else pick


def remeasure_value(means: dict[int, tuple[float, int]], pick: int, noise_std: float) -> float:
    """The knowledge gradient of one more run of `pick`: how much that run is expected to raise the
    true log throughput of the layout chosen by mean, against its closest rival (the best layout, or
    the runner-up when `pick` is the best). The run moves pick's mean by a normal of sd
    noise / sqrt(n (n + 1)) (n: its runs so far); the choice changes when it crosses the rival's:
    EI(-gap, that sd) (Frazier, Powell and Dayanik 2008, for independent arms)."""
    mean, n = means[pick]
    others = sorted((m for j, (m, _) in means.items() if j != pick), reverse=True)
    if not others:
        return 0.0
    gap = abs(mean - others[0])  # the best other layout: the chosen one, or the runner-up when pick leads
    move = noise_std / math.sqrt(n * (n + 1))
    return float(expected_improvement(np.array([-gap]), np.array([move]), 0.0)[0])


class RandomLegalStrategy(Strategy):
    """Uniformly random legal layouts predicted to fit (a stronger baseline than random knobs,
    which would spend almost every proposal on illegal layouts)."""

    name = "random"

    def propose(self, state: SearchState) -> Proposal | None:
        open_ = np.flatnonzero(state.candidates())
        if open_.size == 0:
            return None
        return Proposal(state.legal[int(self.rng.choice(open_))], RANDOM)


class GridStrategy(Strategy):
    """An even stride through the legal set in enumeration order, like a grid sweep cut to the budget."""

    name = "grid"

    def propose(self, state: SearchState) -> Proposal | None:
        open_ = np.flatnonzero(state.candidates())
        if open_.size == 0:
            return None
        stride = max(1, len(state.legal) // max(1, self.budget))
        done = int(state.tried.sum())
        target = (done * stride) % len(state.legal)
        later = open_[open_ >= target]
        return Proposal(state.legal[int(later[0] if later.size else open_[0])], GRID)


class OptunaSamplerStrategy(Strategy):
    """One of Optuna's samplers over the knob domains, as an ordinary strategy.

    The sampler lives in a private in-memory Optuna study fed with every outcome the controller
    records (completed: its throughput; OOM: infeasible). A suggestion that is illegal, already
    tried, dominated by a measured OOM or surely too large is told to that private study as
    infeasible and the sampler asked again (up to MAX_SUGGESTIONS times, then a random legal layout
    stands in); so only legal layouts reach the controller and the study of record.
    """

    sampler_name = "optuna"

    def __init__(self, budget: int, seed: int | None, baseline: LayoutConfig | None = None,
                 space=None) -> None:
        super().__init__(budget, seed, baseline, space)
        self._study = None
        self._seen = 0
        self._worst = None

    @abstractmethod
    def make_sampler(self):
        """The Optuna sampler (TPE, GP, ...) this strategy asks, seeded from `self.seed`."""

    def _private_study(self):
        import optuna

        if self._study is None:
            optuna.logging.set_verbosity(optuna.logging.ERROR)  # as autotune's other commands set it (_optuna.py)
            self._study = optuna.create_study(direction="maximize", sampler=self.make_sampler())
        return self._study

    def _tell(self, params: dict, value: float | None, feasible: bool) -> None:
        import optuna

        from autotune.controller._optuna import distributions

        worst = self._worst if self._worst is not None else 1.0
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=value if feasible else worst * 0.5,
            params=params, distributions=distributions(self.space),
            system_attrs={"constraints:infeasible": -1.0 if feasible else 1.0})  # what set_constraint stores
        self._private_study().add_trial(trial)

    def _sync(self, state: SearchState) -> None:
        from autotune.controller._optuna import params_of

        for i, kind, value in state.outcomes[self._seen:]:
            if kind == "completed" and value:
                self._worst = value if self._worst is None else min(self._worst, value)
                self._tell(params_of(state.legal[i]), value, True)
            elif kind == "oom":
                self._tell(params_of(state.legal[i]), None, False)
        self._seen = len(state.outcomes)

    def propose(self, state: SearchState) -> Proposal | None:
        from optuna.trial import TrialState

        from autotune.controller._optuna import config_of, distributions, params_of

        self._sync(state)
        open_ = state.candidates()
        if not open_.any():
            return None
        study = self._private_study()
        dists = distributions(self.space)
        for _ in range(MAX_SUGGESTIONS):
            trial = study.ask(dists)
            config = config_of(trial.params)
            i = state.index.get(config.key())
            # the asked trial is closed at once; the layout's outcome is told later as a trial of its own
            study.tell(trial, state=TrialState.FAIL)
            if i is not None and open_[i]:
                return Proposal(config, self.name)
            self._tell(params_of(config), None, False)
        return Proposal(state.legal[int(self.rng.choice(np.flatnonzero(open_)))], f"{self.name}-random")


class TpeStrategy(OptunaSamplerStrategy):
    """Optuna's TPE (multivariate, with the infeasible layouts as a constraint)."""

    name = "tpe"

    def make_sampler(self):
        import optuna

        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True)


class GpStrategy(OptunaSamplerStrategy):
    """Optuna's GPSampler (needs torch: `pip install autotune[gp]`)."""

    name = "gp"

    def make_sampler(self):
        import optuna

        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError("--sampler gp needs torch: pip install 'autotune[gp]'") from None
        return optuna.samplers.GPSampler(seed=self.seed, warn_independent_sampling=False)


STRATEGIES = {s.name: s for s in (AutoStrategy, RandomLegalStrategy, GridStrategy, TpeStrategy, GpStrategy)}


def make_strategy(name: str, budget: int, seed: int | None, baseline: LayoutConfig | None,
                  space=None) -> Strategy:
    try:
        return STRATEGIES[name](budget, seed, baseline, space)
    except KeyError:
        raise ConfigError(f"unknown sampler {name!r} (known: {', '.join(STRATEGIES)})") from None
