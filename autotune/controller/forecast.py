"""What a study will cost before it runs: GPU-hours and wall time, from the cost model's step time.

Found by a new-user pass: `start --backend megatron --budget 40` said nothing of what it would spend until the
GPU-hours were spent. The forecast is the cost model's step time of the recipe's own layout (the first run of a
study), times the steps of a run, plus a start-up per run, for every run of the budget (and the validation runs).
It is a forecast, not a bound: a study's layouts run faster and slower than the recipe's, an OOM ends at its
start-up and a pruned run early, and on a real cluster the model's step time may be off by tens of percent
(README, "How good is the cost model"). The bound is the trial timeout, printed beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.controller.options import StudyOptions

# a run's first step compiles and warms the allocator: the simulate backend charges it 3 steps and each further
# warm-up step 1.1 (backends/simulate.py); a real run's first step is of that order
FIRST_STEP_FACTOR = 3.0
WARMUP_STEP_FACTOR = 1.1
# start-up of a real run (model build, NCCL initialisation, data loader) before its first step, assumed: the
# simulate backend's default, which no measurement here has checked
ASSUMED_STARTUP_S = 90.0
# the runner-up is validated too when within the noise: at most two validation runs (controller/recommend.py)
MAX_VALIDATION_RUNS = 2


@dataclass(frozen=True)
class Forecast:
    """The expected cost of a study's runs. `run_s` is None when the cost model has no step time for the
    recipe's layout (illegal for this workload): only the timeout bound is then known."""
    runs: int
    gpus: int
    run_s: float | None
    validation_run_s: float | None
    validation_runs: int
    timeout_s: float
    startup_s: float
    startup_assumed: bool

    @property
    def gpu_hours(self) -> float | None:
        if self.run_s is None:
            return None
        seconds = self.runs * self.run_s + self.validation_runs * (self.validation_run_s or 0.0)
        return seconds * self.gpus / 3600

    @property
    def bound_gpu_hours(self) -> float:
        """Every run at the trial timeout (a run past it is stopped)."""
        return (self.runs + self.validation_runs) * self.timeout_s * self.gpus / 3600

    def wall_hours(self, concurrency: int) -> float | None:
        hours = self.gpu_hours
        return None if hours is None else hours / self.gpus / max(1, concurrency)

    def line(self, concurrency: int | None, simulated: str | None) -> str:
        """One line for `start`'s header and `--dry-run`; `simulated` names the backend's source of figures
        (simulated, replayed) when the study spends no GPU time itself."""
        bound = f"at most {_hours(self.bound_gpu_hours)} GPU-hours if every run reached the {self.timeout_s:g} s timeout"
        validation = f" and up to {self.validation_runs} validation run(s)" if self.validation_runs else ""
        if self.gpu_hours is None:
            return (f"forecast: no step time for the recipe's layout on this workload; {self.runs} run(s){validation} "
                    f"on {self.gpus} GPUs, {bound}")
        if self.validation_run_s is not None:
            validation += f" of about {self.validation_run_s / 60:.1f} min"
        startup = f"{self.startup_s:g} s start-up" + (" assumed" if self.startup_assumed else "")
        wall = f", about {_hours(self.wall_hours(concurrency))} h of wall time at {concurrency} at a time" \
            if concurrency else ""
        where = (f"{simulated} study, no GPU time is spent; on a cluster it would take " if simulated else "")
        return (f"forecast: {where}about {_hours(self.gpu_hours)} GPU-hours for {self.runs} run(s) of about "
                f"{self.run_s / 60:.1f} min{validation} on {self.gpus} GPUs{wall} (the cost model's step time of "
                f"the recipe's layout, {startup}; {bound})")


def _hours(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}" if value < 1 else f"{value:.1f}"


def forecast(space, workload, budget: int, options: StudyOptions, startup_s: float | None) -> Forecast:
    """The forecast of a study of `budget` runs. `startup_s` is the backend's own start-up per run when it has
    one (simulate, replay), else None: ASSUMED_STARTUP_S."""
    from autotune.controller.session import recipe_baseline
    from autotune.cost import estimate
    from autotune.space import violations

    layout = recipe_baseline(space)
    step_s = None if violations(layout, workload) else estimate(workload, layout).step_time_s
    assumed = startup_s is None
    start = ASSUMED_STARTUP_S if startup_s is None else startup_s

    def run_s(measured_steps: int) -> float | None:
        if step_s is None:
            return None
        warmups = max(0, options.warmup_steps - 1) * WARMUP_STEP_FACTOR
        first = FIRST_STEP_FACTOR if options.warmup_steps else 0.0
        steps = first + warmups + measured_steps
        return start + step_s * steps

    validations = MAX_VALIDATION_RUNS if options.validate_steps else 0
    return Forecast(runs=budget, gpus=workload.cluster.gpus, run_s=run_s(options.measured_steps),
                    validation_run_s=run_s(options.validate_steps) if validations else None,
                    validation_runs=validations, timeout_s=options.trial_timeout_s, startup_s=start,
                    startup_assumed=assumed)
