"""Screening: why a proposed layout must not run, decided before anything is dispatched.

A rejection is recorded as a trial row with its rule (outside the budget); it is not an Optuna trial.
Its constraint kind and value are what Optuna is told (infeasible, never a failure) in the one case a
rejected layout has an Optuna trial: a claim lost in a race between controllers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.config import LayoutConfig, Workload
from autotune.controller.state import P_FIT_REJECT, SearchState
from autotune.space import SearchSpace, policy_violations, violations

MAX_FRONTIER_SKIPS = 200  # OOM-frontier layouts recorded per proposal (the rest stay implied)


@dataclass(frozen=True)
class Rejection:
    reason: str  # a legality rule's name, a policy's, or outside_space / oom_frontier / predicted_oom / duplicate
    message: str
    constraint: float  # > 0: how far outside the feasible region (Optuna's constraint value)
    implied_by: int | None = None  # the trial whose OOM implies this one (oom_frontier)

    @property
    def kind(self) -> str:
        return constraint_kind(self.reason)


def constraint_kind(reason: str) -> str:
    """The Optuna constraint a rejection with this reason violates."""
    if "oom" in reason:
        return "memory"
    return "duplicate" if reason == "duplicate" else "legality"


DUPLICATE = Rejection("duplicate", "already dispatched in this study", 1.0)


def frontier_message(source: int) -> str:
    return f"needs at least the memory of trial {source}, which ran out of memory"


def screen(config: LayoutConfig, workload: Workload, space: SearchSpace, state: SearchState) -> Rejection | None:
    """The first reason `config` must not run, or None. Duplicates are found by the repository's
    claim, under the study's lock, so they are not screened here."""
    bad = violations(config, workload)
    if bad:
        return Rejection(bad[0].rule, "; ".join(v.message for v in bad), float(len(bad)))
    policy = policy_violations(config, workload, space.policy)
    if policy:
        return Rejection(policy[0].rule, policy[0].message, 1.0)
    i = state.index.get(config.key())
    if i is None and config.perf():
        # a performance-knob variant: in the space when its layout is and every knob value is in the
        # space's perf_knobs domain; its layout's OOM frontier and fit probability stand for it
        outside = [k for k, v in config.perf().items() if v not in space.perf_domains.get(k, ())]
        i = None if outside else state.index.get(config.layout_only().key())
    if i is None:
        return Rejection("outside_space", "not in the study's search space (a --fix or domain excludes it)", 1.0)
    if state.frontier_by[i] >= 0:
        source = int(state.frontier_by[i])
        return Rejection("oom_frontier", frontier_message(source), 1.0, source)
    p_fit = float(state.p_fit_at(np.array([i]))[0])
    if p_fit < P_FIT_REJECT:
        limit = workload.cluster.gpu.memory_gib
        peak = state.predicted_peak_gib(i)
        return Rejection("predicted_oom", f"predicted {peak:.1f} GiB of {limit:g} GiB (fits with probability "
                                          f"{p_fit:.0%})", max(peak - limit, 0.01))
    return None


def frontier_skips(state: SearchState, chosen: LayoutConfig, note: str) -> list[dict[str, Any]]:
    """The untried OOM-frontier layouts the prior ranked above `chosen`, as rejected-trial rows with
    their source trial (what a model-only search would have run and lost); marked tried in `state`."""
    i = state.index.get(chosen.key())
    if i is None:
        return []
    speed = state.log_prior
    skipped = np.flatnonzero(~state.tried & (state.frontier_by >= 0) & (speed > speed[i]))
    rows = []
    for j in skipped[:MAX_FRONTIER_SKIPS]:
        config = state.legal[j]
        source = int(state.frontier_by[j])
        rows.append({"config": config.to_dict(), "config_key": config.key(), "reason": "oom_frontier",
                     "message": frontier_message(source), "implied_by_trial": source, "strategy_note": note})
        state.tried[j] = True
    return rows
