"""What a study will cost before it runs: GPU-hours and wall time, from the study's first layout.

Found by a new-user pass: `start --backend megatron --budget 40` said nothing of what it would spend until the
GPU-hours were spent. The forecast takes the layout the study runs first (the recipe's own, when it is legal
here and may fit; else a layout of median predicted step time among those that may fit), its step time (the
backend's own figure when it has one, a replay table's row; else the cost model's), and what a run of that step
holds its GPUs (the backend's charge for simulated and replayed runs; for a real launch an assumed start-up and a
slow first step), capped at the trial timeout, for every run of the budget and the validation runs.
It is a forecast, not a bound: a study's layouts run faster and slower than the first, an OOM ends at its
start-up and a pruned run early, and on a real cluster the model's step time may be off by tens of percent
(README, "How good is the cost model"). The bound is every run at its timeout, printed beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune._tables import duration
from autotune.controller.options import StudyOptions

# start-up of a real run (model build, NCCL initialisation, data loader) before its first step, assumed: the
# simulate backend's default, which no measurement here has checked
ASSUMED_STARTUP_S = 90.0


@dataclass(frozen=True)
class Forecast:
    """The expected cost of a study's runs still to make (see the module doc)."""
    runs: int
    gpus: int
    layout: str  # the layout priced (LayoutConfig.short())
    priced: str  # whose layout and step time: e.g. "the cost model's step time of the recipe's layout"
    step_s: float
    run_s: float  # one screening run, capped at the trial timeout
    uncapped_run_s: float
    timeout_s: float
    startup_assumed: bool
    startup_s: float | None
    validation_runs: int = 0
    validation_run_s: float = 0.0
    validation_timeout_s: float = 0.0
    open_layouts: int | None = None  # layouts the study may still run, when fewer than its runs
    cap_gpu_hours: float | None = None  # the GPU-hours --max-gpu-hours leaves the study (None: no cap)

    @property
    def gpu_hours(self) -> float:
        return (self.runs * self.run_s + self.validation_runs * self.validation_run_s) * self.gpus / 3600

    @property
    def bound_gpu_hours(self) -> float:
        """Every run at its timeout (a run past it is stopped)."""
        return (self.runs * self.timeout_s + self.validation_runs * self.validation_timeout_s) * self.gpus / 3600

    @property
    def over_timeout(self) -> bool:
        return self.uncapped_run_s > self.timeout_s

    def wall_hours(self, concurrency: int) -> float:
        """Screening runs in rounds of `concurrency`, then the validation runs one after the other."""
        rounds = math.ceil(self.runs / max(1, concurrency))
        return (rounds * self.run_s + self.validation_runs * self.validation_run_s) / 3600

    def under_cap(self) -> tuple[int, int, float]:
        """(runs, validation runs, GPU-hours) the study makes under its cap, as the controller starts them: a run
        starts while the hours held, those in flight counted at the mean of the runs that ended (before any has, at
        this forecast's run), are below the cap (loop.Controller._cap_reached), so at least one. Every run taken as
        long as the one priced."""
        if self.cap_gpu_hours is None:
            return self.runs, self.validation_runs, self.gpu_hours
        cap = self.cap_gpu_hours
        run_h = self.run_s * self.gpus / 3600
        runs = self.runs if run_h <= 0 else min(self.runs, max(1, math.ceil(cap / run_h)))
        spent = runs * run_h
        validations = 0
        validation_h = self.validation_run_s * self.gpus / 3600
        while validations < self.validation_runs and (runs == self.runs) and spent < cap:
            validations += 1
            spent += validation_h
        return runs, validations, spent

    def to_dict(self) -> dict[str, Any]:
        under_cap = self.under_cap()
        return {"runs": self.runs, "gpus": self.gpus, "layout": self.layout, "priced": self.priced,
                "step_time_s": self.step_s, "run_s": self.run_s, "gpu_hours": self.gpu_hours,
                "bound_gpu_hours": self.bound_gpu_hours, "trial_timeout_s": self.timeout_s,
                "over_timeout": self.over_timeout, "startup_s": self.startup_s, "startup_assumed": self.startup_assumed,
                "validation_runs": self.validation_runs, "validation_run_s": self.validation_run_s,
                "open_layouts": self.open_layouts, "cap_gpu_hours": self.cap_gpu_hours,
                # what the cap lets start (under_cap)
                "runs_under_cap": under_cap[0], "validation_runs_under_cap": under_cap[1]}

    def line(self, concurrency: int | None, simulated: str | None) -> str:
        """One line for `start`'s and `resume`'s header and `--dry-run`; `simulated` names the backend's source of
        figures (simulated, replayed) when the study spends no GPU time itself."""
        where = f"{simulated} study, no GPU time is spent; on a cluster it would take " if simulated else ""
        validation = (f" and up to {self.validation_runs} validation run(s) of {duration(self.validation_run_s)}"
                      if self.validation_runs else "")
        wall = f", about {duration(self.wall_hours(concurrency) * 3600)} of wall time running {concurrency} at a time" \
            if concurrency else ""
        startup = "" if self.startup_s is None else \
            f", {self.startup_s:,.0f} s start-up" + (" assumed" if self.startup_assumed else "")
        screening = f"{self.runs:,} run(s) of {duration(self.run_s)}" if self.runs else "no screening run"
        text = (f"forecast: {where}about {hours_text(self.gpu_hours)} GPU-hours for {screening}"
                f"{validation} on {self.gpus:,} GPUs{wall} ({self.priced}, {self.layout}"
                f"{startup}; at most {hours_text(self.bound_gpu_hours)} GPU-hours if every run reached its timeout)")
        if self.over_timeout:  # found by review: every run timed out, and nothing had said it would
            text += (f"; WARNING: that run needs about {duration(self.uncapped_run_s)}, over the {self.timeout_s:,g} s "
                     "--trial-timeout: most runs will time out")
        runs, validations, spent = self.under_cap()
        if runs < self.runs or validations < self.validation_runs:  # the cap stops something (review: "before 0 of
            # its 0 validation runs" when the cap stopped nothing)
            stops = (f"after about {runs:,} of its {self.runs:,} run(s)" if runs < self.runs else
                     f"before {self.validation_runs - validations} of its {self.validation_runs} validation run(s)")
            text += (f"; the --max-gpu-hours cap leaves {hours_text(self.cap_gpu_hours)} GPU-hours: it stops the study "
                     f"{stops}, about {hours_text(spent)} GPU-hours")
        if self.open_layouts is not None:
            text += (f"; the space holds {self.open_layouts:,} layout(s) that may fit and are not run yet: "
                     "the study may stop before its budget")
        return text


def hours_text(value: float) -> str:
    """GPU-hours as the forecast writes them: `0.46`, `7.4`, `1,280`, `less than 0.01`."""
    if value < 0.01:
        return "less than 0.01"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}" if value < 1 else f"{value:.1f}"


def forecast(state, baseline, runs: int, options: StudyOptions, backend, backend_options: dict[str, Any],
             spent_gpu_hours: float = 0.0, validations_made: int = 0) -> Forecast:
    """The forecast of `runs` runs of a study whose controller holds `state` (its SearchState: the legal set, the
    cost model's predictions, what ran), `baseline` the recipe's layout, `backend` the backend class;
    `spent_gpu_hours` what its runs held so far (of its --max-gpu-hours), `validations_made` the validation runs
    it made (a resumed study owes only the rest)."""
    from autotune.backends.base import charged_steps
    from autotune.controller._spec import validation_timeout_s
    from autotune.storage.repository import MAX_VALIDATION_RUNS

    open_ = state.candidates()
    i = state.index.get(baseline.key()) if baseline is not None else None
    if i is not None and open_[i]:
        whose = "the recipe's layout"
    else:  # the study starts elsewhere: a typical layout of those it may run
        rows = np.flatnonzero(open_) if open_.any() else np.arange(len(state.legal))
        steps = state.predicted.step_time_s[rows]
        i = int(rows[np.argsort(steps)[len(rows) // 2]])
        whose = "a layout of median predicted step time"
    layout = state.legal[i]
    known = backend.known_step_seconds(backend_options, layout.key())
    step_s = known if known is not None else float(state.predicted.step_time_s[i])
    source = "the replay table's step time" if known is not None else "the cost model's step time"

    def held(measured_steps: int) -> tuple[float, float | None, bool]:
        charged = backend.held_seconds(backend_options, step_s, options.warmup_steps, measured_steps)
        if charged is not None:
            return charged, backend.startup_seconds(backend_options), False
        return ASSUMED_STARTUP_S + step_s * charged_steps(options.warmup_steps, measured_steps), ASSUMED_STARTUP_S, True

    run_s, startup_s, assumed = held(options.measured_steps)
    validations = max(0, MAX_VALIDATION_RUNS - validations_made) if options.validate_steps else 0
    validation_s, validation_timeout = 0.0, 0.0
    if validations:
        validation_timeout = validation_timeout_s(options, step_s)
        validation_s = min(held(options.validate_steps)[0], validation_timeout)
    may_run = int(open_.sum())
    return Forecast(runs=runs, gpus=state.workload.cluster.gpus, layout=layout.short(), priced=f"{source} of {whose}",
                    step_s=step_s, run_s=min(run_s, options.trial_timeout_s), uncapped_run_s=run_s,
                    timeout_s=options.trial_timeout_s, startup_assumed=assumed, startup_s=startup_s,
                    validation_runs=validations, validation_run_s=validation_s,
                    validation_timeout_s=validation_timeout, open_layouts=may_run if may_run < runs else None,
                    cap_gpu_hours=None if options.max_gpu_hours is None else max(0.0, options.max_gpu_hours - spent_gpu_hours))
