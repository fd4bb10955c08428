"""Layout first, then the performance knobs at the leading layouts, in one budget (issue 16).

Why not one joint space: the knobs multiply the ~65k legal layouts of qwen3_30b@16 by ~40 conditional
settings each, and their effects are nearly separable from the layout's (a dispatcher or an overlap
changes one step-time term; the cost model's ratio says how much). So the inner strategy searches layouts
with every knob at the recipe's value, planning (and remeasuring its close contenders) for the budget
less the knob share; in the last `knob_share` of the budget (default 10%) the knob phase takes over:
coordinate ascent from the best measured configurations that keep the memory headroom, one knob changed at a time (EP overlap brings the smallest VPP along where PP > 1 needs one), each candidate
scored by the centre's posterior throughput times the cost model's predicted ratio (the calibrated measurement carries the layout, the model the knob), the
best first. A variant is screened like any layout (legality incl. the knob rules, its layout's OOM frontier
and fit). `benchmarks/search_quality.py --knobs` compares this with layout-only tuning on landscapes where
knob effects are drawn independently of the cost model.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.config import LayoutConfig
from autotune.controller.notes import KNOBS
from autotune.controller.state import SearchState
from autotune.controller.strategies import Proposal, Strategy

DEFAULT_KNOB_SHARE = 0.1
CENTRES = 2  # knob variants are tried around the best measured configurations, this many


class KnobPhase(Strategy):
    """Wraps a layout strategy: its proposals, except in the knob window (see the module docstring)."""

    def __init__(self, inner: Strategy, share: float = DEFAULT_KNOB_SHARE) -> None:
        super().__init__(inner.budget, inner.seed, inner.baseline, inner.space)
        self.inner = inner
        self.name = inner.name
        self.share = share
        self._estimates: dict[str, Any] = {}  # config key -> the cost model's Estimate
        # the layout search (its remeasurement of close contenders included) plans for the budget
        # before the knob window, so the knob phase starts from well-measured layouts
        inner.budget = max(1, self.budget - self.knob_slots())

    @property
    def remeasure(self) -> bool:  # the inner strategy's switch (set by the controller)
        return self.inner.remeasure

    @remeasure.setter
    def remeasure(self, value: bool) -> None:
        if hasattr(self, "inner"):
            self.inner.remeasure = value

    def knob_slots(self) -> int:
        return knob_slots(self.space, self.share, self.budget)

    def in_window(self, state: SearchState) -> bool:
        """The budget's last knob_slots() trials."""
        return 0 < self.budget - state.dispatched <= self.knob_slots()

    def propose(self, state: SearchState) -> Proposal | None:
        measured = bool(state.runs or state.variant_runs)
        knobs_first = measured and self.in_window(state)
        if knobs_first:
            proposal = self._knob_proposal(state)
            if proposal is not None:
                return proposal
        proposal = self.inner.propose(state)
        if proposal is None and measured and not knobs_first:
            # every layout is tried (a small space, a replay table): the rest of the budget tunes knobs
            return self._knob_proposal(state)
        return proposal

    # --- the knob phase ------------------------------------------------------------------------------

    def _measured(self, state: SearchState) -> list[tuple[float, LayoutConfig]]:
        """(log tokens/s/GPU, config) of every measured configuration, best first: the GP's posterior
        mean for layouts (a lucky single run does not make a centre), the mean of runs for variants."""
        import numpy as np

        rows: list[tuple[float, LayoutConfig]] = []
        if state.runs:
            measured = np.array(sorted(state.runs))
            mean, _ = state.posterior(measured)
            # only layouts that keep the memory headroom: a faster setting of one that does not could not
            # be recommended, so tuning its knobs would spend the budget on nothing
            keeps = state.fits(0.5, state.headroom_gib)[measured]
            # ...and, where a run measured its peak, that peak decides (the model's fit is for the unmeasured)
            margin = state.workload.cluster.gpu.memory_gib - state.headroom_gib
            peaks = {}
            for i, log_ratio in state.memory.observations:
                peaks[i] = max(peaks.get(i, 0.0), float(state.memory.predicted_gib[i] * np.exp(log_ratio)))
            keeps &= np.array([peaks.get(int(i), 0.0) <= margin for i in measured])
            rows += [(float(m), state.legal[int(i)]) for i, m, ok in zip(measured, mean, keeps) if ok]
        layouts = {c.key() for _, c in rows}
        rows += [(sum(r) / len(r), state.variants[k]) for k, r in state.variant_runs.items()
                 if state.variants[k].layout_only().key() in layouts]
        return sorted(rows, key=lambda row: -row[0])

    def _knob_proposal(self, state: SearchState) -> Proposal | None:
        from autotune.space.legality import violations

        workload = state.workload
        limit = workload.cluster.gpu.memory_gib
        best: tuple[float, LayoutConfig] | None = None
        seen_layouts: set[str] = set()
        for mean, centre in self._measured(state):
            layout_key = centre.layout_only().key()
            if layout_key in seen_layouts:
                continue  # a layout's best measured setting is its centre
            seen_layouts.add(layout_key)
            if len(seen_layouts) > CENTRES:
                break
            centre_estimate = self._cached(workload, centre)
            base_log = math.log(centre_estimate.tokens_per_s_per_gpu)
            # the centre's calibrated peak (its layout's; a variant's layout is always a measured one)
            centre_calibrated_gib = state.predicted_peak_gib(state.index[layout_key])
            for candidate in self._neighbours(centre, state):
                key = candidate.key()
                if key in state.variant_tried or state.index.get(key, -1) >= 0 and state.tried[state.index[key]]:
                    continue
                if violations(candidate, workload) or (state.answerable is not None and key not in state.answerable):
                    continue
                estimate = self._estimate(workload, candidate)
                # a knob that adds memory (graphs, less recompute, the VPP EP overlap needs) must keep the
                # centre inside the headroom (else it could not be recommended); judged from the centre's
                # calibrated peak, scaled by the model's ratio for the change
                centre_peak = centre_estimate.peak_mem_gib
                if estimate.peak_mem_gib > centre_peak and \
                        centre_calibrated_gib * estimate.peak_mem_gib / centre_peak > limit - state.headroom_gib:
                    continue
                score = mean + math.log(estimate.tokens_per_s_per_gpu) - base_log
                if best is None or score > best[0]:
                    best = (score, candidate)
        return None if best is None else Proposal(best[1], KNOBS)

    def _neighbours(self, centre: LayoutConfig, state: SearchState):
        """`centre` with one performance knob changed to another value of its domain (a knob set back to
        the recipe's value is left at None, so each configuration has one key)."""
        from autotune.space.perf_values import effective, exists

        workload = state.workload
        values = centre.to_dict()
        current = effective(values, workload)
        defaults = workload.model.perf_defaults
        for name, domain in self.space.perf_domains.items():
            base = centre
            if name == "ep_overlap" and centre.pp > 1 and centre.vpp == 1 and centre.ep > 1:
                # EP overlap needs an interleaved schedule with PP > 1: bring the smallest VPP along
                vpps = [v for v in self.space.domains.get("vpp", ()) if v > 1]
                if not vpps:
                    continue
                base = centre.replace(vpp=min(vpps))
            elif not exists(name, values, workload):
                continue
            for value in domain:
                if value == current.get(name):
                    continue
                yield base.replace(**{name: None if value == defaults.get(name) else value})

    def _estimate(self, workload, config: LayoutConfig):
        from autotune.cost import estimate

        return estimate(workload, config)

    def _cached(self, workload, config: LayoutConfig):
        """The estimate of a centre, computed once (centres repeat from one proposal to the next)."""
        key = config.key()
        if key not in self._estimates:
            self._estimates[key] = self._estimate(workload, config)
        return self._estimates[key]


def knob_slots(space, share: float, budget: int) -> int:
    """Trials of the knob phase: the share of the budget, rounded (none in a budget too small for it, or
    where the space has no performance knobs to tune)."""
    if space is None or not space.perf_domains or share <= 0:
        return 0
    return round(share * budget)


def with_knob_phase(strategy: Strategy, share: float) -> Strategy:
    """`strategy` with the knob phase when the phase would get trials of the budget (knob_slots)."""
    if knob_slots(strategy.space, share, strategy.budget):
        return KnobPhase(strategy, share)
    return strategy
