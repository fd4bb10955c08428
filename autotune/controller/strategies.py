"""Proposal strategies: which layout to try next.

Contract (every strategy): `propose(state)` returns the next layout to dispatch as a Proposal, or
None when it has nothing left. Strategies read the SearchState only; they never touch storage,
Optuna or Ray (the controller does). A strategy with `uses_optuna_sampler` lets Optuna's sampler
suggest instead (the controller calls `ask()` without a layout) and only ranks nothing itself.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from autotune.config import LayoutConfig
from autotune.controller.state import SearchState
from autotune.errors import ConfigError

EXPLORE_SHARE = 0.35  # of the budget spent on distinct structural families before refining
UCB_KAPPA = 1.0  # optimism of refinement, in posterior standard deviations


@dataclass(frozen=True)
class Proposal:
    config: LayoutConfig
    note: str  # why it was chosen: baseline / explore / refine / random / grid


class Strategy(ABC):
    name = "base"
    uses_optuna_sampler = False

    def __init__(self, budget: int, seed: int | None, baseline: LayoutConfig | None = None) -> None:
        self.budget = budget
        self.rng = np.random.default_rng(seed)
        self.baseline = baseline

    @abstractmethod
    def propose(self, state: SearchState) -> Proposal | None:
        """The next layout to dispatch, or None when none is left (see the module contract)."""

    def _baseline(self, state: SearchState) -> Proposal | None:
        """The recipe's own layout first, when it is legal here and predicted to fit."""
        if self.baseline is None:
            return None
        i = state.index.get(self.baseline.key())
        if i is not None and state.candidates()[i]:
            return Proposal(self.baseline, "baseline")
        return None


class AutoStrategy(Strategy):
    """Model-guided: baseline, then the best layout of each untried structural family (diversity),
    then the best corrected prediction (refinement). See controller/state.py for the corrections."""

    name = "auto"

    def propose(self, state: SearchState) -> Proposal | None:
        first = self._baseline(state)
        if first is not None:
            return first
        open_ = state.candidates()
        if not open_.any():
            return None
        score = np.where(open_, state.corrected_speed(), -np.inf)
        dispatched = int(state.tried.sum())
        if dispatched < math.ceil(EXPLORE_SHARE * self.budget):
            i = self._best_new_family(state, score)
            if i is not None:
                return Proposal(state.legal[i], "explore")
        i = state.optimistic_best(open_, UCB_KAPPA)
        return Proposal(state.legal[int(np.argmax(score)) if i is None else i], "refine")

    @staticmethod
    def _best_new_family(state: SearchState, score: np.ndarray) -> int | None:
        """The best-scoring open layout of a structural family no trial has touched yet."""
        new_family = ~np.isin(state.family, state.family[state.tried])
        masked = np.where(new_family, score, -np.inf)
        i = int(np.argmax(masked))
        return i if np.isfinite(masked[i]) else None


class RandomLegalStrategy(Strategy):
    """Uniformly random legal layouts predicted to fit (a stronger baseline than random knobs,
    which would spend almost every proposal on illegal layouts)."""

    name = "random"

    def propose(self, state: SearchState) -> Proposal | None:
        open_ = np.flatnonzero(state.candidates())
        if open_.size == 0:
            return None
        return Proposal(state.legal[int(self.rng.choice(open_))], "random")


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
        return Proposal(state.legal[int(later[0] if later.size else open_[0])], "grid")


class TpeStrategy(Strategy):
    """Optuna's TPE over the knob domains; illegal or predicted-OOM suggestions are rejected by the
    controller and told to Optuna as infeasible, so the sampler learns the constraints."""

    name = "tpe"
    uses_optuna_sampler = True

    def propose(self, state: SearchState) -> Proposal | None:  # pragma: no cover - not called
        raise NotImplementedError("the controller asks Optuna's sampler directly")


STRATEGIES = {s.name: s for s in (AutoStrategy, RandomLegalStrategy, GridStrategy, TpeStrategy)}


def make_strategy(name: str, budget: int, seed: int | None, baseline: LayoutConfig | None) -> Strategy:
    try:
        return STRATEGIES[name](budget, seed, baseline)
    except KeyError:
        raise ConfigError(f"unknown sampler {name!r} (known: {', '.join(STRATEGIES)})") from None
