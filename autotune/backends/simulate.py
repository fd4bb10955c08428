"""The `simulate` backend: the analytical cost model stands in for a GPU run.

A layout the model says does not fit ends as OOM (so the OOM path runs without a GPU); the others
report warm-up and measured steps with optional measurement noise. For benchmarks the backend can
also hide a *landscape* that is not the tuner's own model: seeded per-knob-value biases, per-layout
noise and a memory-model error, which the controller never sees (they live in backend options).

Options (all optional):
  noise             relative std of per-step measurement noise (default 0.01)
  landscape_seed    seed of the hidden landscape; absent = the cost model itself
  landscape         its family (backends/_landscapes.py): knob (default), interact, regime,
                    prior_wrong, mixed
  knob_bias         max relative per-knob-value bias of the knob landscape (default 0.12)
  layout_noise      max relative per-layout deviation (default 0.02)
  memory_error      max relative error of the memory model (default 0.05 knob, 0.08 others)
  run_noise         max relative throughput deviation of one run, drawn anew per run (default 0)
  stragglers        share of runs that land on a slow node, 20-40% slower (default 0)
  traced            every completed run carries the measured parts of its step (compute, exposed
                    communication) as an nsys trace of it would (default false): the hidden landscape's
                    own split of the true step, see Landscape.step_parts
  trace_noise       max relative error of each traced part, drawn anew per run (default 0.05)
  startup_s         simulated seconds before the first step (model build, NCCL init; default 90)
  seconds_per_trial real seconds one trial takes, to watch a study run (default 0.05)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from autotune.backends._landscapes import (FAMILIES, Landscape, model_parts, run_noise_factor, straggler_factor,
                                           unit_hash)
from autotune.backends.base import (FIRST_STEP_FACTOR, WARMUP_STEP_FACTOR, Backend, Reporter, StepReport, TrialOutcome,
                                    TrialSpec, TrialStatus, charged_steps)
from autotune.config import LayoutConfig, Workload


# Simulated seconds before a run's first step (model build, NCCL init): what a study's simulated and replayed
# runs are charged besides their steps (the `startup_s` option overrides it).
STARTUP_S = 90.0


def startup_seconds(options: dict) -> float:
    """The start-up a simulated or replayed run is charged (`startup_s` in the backend's options)."""
    return float(options.get("startup_s", STARTUP_S))


def workload_from_spec(spec: TrialSpec) -> Workload:
    from autotune.space import make_workload, space_from_document

    options = spec.backend_options
    space = space_from_document(options.get("space_document"), str(options.get("space_source") or spec.model))
    return make_workload(space, gpus=spec.gpus, gpus_per_node=spec.gpus_per_node, gpu=spec.gpu,
                         global_batch_size=spec.global_batch_size, seq_length=spec.seq_length,
                         precision=spec.precision, network_gbps=spec.backend_options.get("network_gbps"))


def landscape_from_options(opts: dict) -> Landscape | None:
    if opts.get("landscape_seed") is None:
        return None
    family = str(opts.get("landscape", "knob"))
    if family not in FAMILIES:
        raise ValueError(f"unknown landscape {family!r} (known: {', '.join(FAMILIES)})")
    memory_error = opts.get("memory_error")
    return Landscape(int(opts["landscape_seed"]), family, knob_bias=float(opts.get("knob_bias", 0.12)),
                     layout_noise=float(opts.get("layout_noise", 0.02)),
                     memory_error=None if memory_error is None else float(memory_error))


# each numeric option's range (a share, seconds): checked before a study stores them or resumes with them
NUMERIC_OPTIONS = {"noise": 1.0, "knob_bias": 1.0, "layout_noise": 1.0, "memory_error": 1.0, "run_noise": 1.0,
                   "stragglers": 1.0, "trace_noise": 1.0, "startup_s": 86400.0, "seconds_per_trial": 86400.0}


def check_numbers(options: dict[str, Any], ranges: dict[str, float], backend: str) -> None:
    """Each option of `ranges` that is given a number within 0..its high (ConfigError naming it); an option
    given as null counts as given (found by review: a hand-edited `startup_s: null` was skipped here and made
    `resume` raise float(None)'s TypeError), except `memory_error`, whose null means the landscape's default."""
    from autotune._numbers import is_finite_number
    from autotune.errors import ConfigError

    for key, high in ranges.items():
        if key not in options or (options[key] is None and key == "memory_error"):
            continue
        value = options[key]
        if not (is_finite_number(value) and not isinstance(value, bool) and 0 <= value <= high):
            raise ConfigError(f"{backend} backend option {key} = {str(value)[:40]!r}: a number within 0..{high:g}")


class SimulateBackend(Backend):
    name = "simulate"
    cli_options = {**Backend.cli_options, "noise": "noise", "sim_seconds": "seconds_per_trial"}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Numbers within their ranges, a known landscape, an integer seed (found by an adversarial pass: a
        hand-edited `noise: "loud"` made every resumed trial fail with the backend's ValueError)."""
        from autotune.errors import ConfigError

        check_numbers(options, NUMERIC_OPTIONS, "simulate")
        seed = options.get("landscape_seed")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2 ** 32):
            raise ConfigError(f"simulate backend option landscape_seed = {str(seed)[:40]!r}: an integer within 0..2^32")
        if str(options.get("landscape", "knob")) not in FAMILIES:
            raise ConfigError(f"simulate backend option landscape = {str(options.get('landscape'))[:40]!r} "
                              f"(known: {', '.join(FAMILIES)})")
        return options

    @classmethod
    def startup_seconds(cls, options: dict[str, Any]) -> float:
        return startup_seconds(options)

    @classmethod
    def held_seconds(cls, options: dict[str, Any], step_time_s: float, warmup_steps: int,
                     measured_steps: int) -> float:
        return startup_seconds(options) + step_time_s * charged_steps(warmup_steps, measured_steps)

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        from autotune.cost import estimate

        opts = {**self.options, **spec.backend_options}
        workload = workload_from_spec(spec)
        config = LayoutConfig.from_mapping(spec.config)
        land = landscape_from_options(opts)
        predicted = estimate(workload, config)
        peak_gib = predicted.peak_mem_gib
        if land is not None and land.owns_knob_effects:
            # the landscape holds the knobs' true effects: start from the layout with the recipe's values
            predicted = estimate(workload, config.layout_only())
        step_time_s = predicted.step_time_s
        if land is not None:
            step_time_s /= land.speed_factor(config, workload)
            peak_gib *= land.memory_factor(config)
        step_time_s /= run_noise_factor(spec.seed, spec.trial, spec.attempt, float(opts.get("run_noise", 0.0)))
        step_time_s /= straggler_factor(spec.seed, spec.trial, spec.attempt, float(opts.get("stragglers", 0.0)))
        startup_s = startup_seconds(opts)
        limit = workload.cluster.gpu.memory_gib
        if peak_gib > limit:
            return TrialOutcome(spec.trial, TrialStatus.OOM, peak_mem_gib=peak_gib, wall_time_s=startup_s,
                                error=f"CUDA out of memory: needs {peak_gib:.1f} GiB of {limit:g} GiB")
        rng = np.random.default_rng([spec.seed, spec.trial, spec.attempt])
        noise = float(opts.get("noise", 0.01))
        steps = spec.warmup_steps + spec.measured_steps
        pause_s = float(opts.get("seconds_per_trial", 0.05)) / max(1, steps)
        times: list[float] = []
        for step in range(1, steps + 1):
            if cancelled.is_set():
                return TrialOutcome(spec.trial, TrialStatus.PRUNED, step_times_s=times,
                                    wall_time_s=startup_s + sum(times), error="cancelled by the controller")
            warmup = step <= spec.warmup_steps
            slowdown = FIRST_STEP_FACTOR if step == 1 else (WARMUP_STEP_FACTOR if warmup else 1.0)
            seconds = step_time_s * slowdown * max(0.5, 1.0 + noise * rng.standard_normal())
            times.append(seconds)
            if pause_s:
                time.sleep(pause_s)
            report(StepReport(spec.trial, step, seconds, warmup))
            if startup_s + sum(times) > spec.timeout_s:
                return TrialOutcome(spec.trial, TrialStatus.TIMEOUT, step_times_s=times,
                                    wall_time_s=spec.timeout_s, error=f"over the trial timeout of {spec.timeout_s:g} s")
        measured = times[spec.warmup_steps:]
        mean_step = float(np.mean(measured))
        terms = traced_terms(spec, opts, land, config, workload, predicted.breakdown, mean_step) \
            if opts.get("traced") else {}
        return TrialOutcome(spec.trial, TrialStatus.COMPLETED, step_time_s=mean_step,
                            peak_mem_gib=peak_gib, step_times_s=times, wall_time_s=startup_s + sum(times),
                            measured_terms_s=terms)


def traced_terms(spec: TrialSpec, opts: dict, land: Landscape | None, config: LayoutConfig, workload: Workload,
                 predicted_s: dict[str, float], mean_step_s: float) -> dict[str, float]:
    """What an nsys trace of this run would measure (_numbers.MEASURED_TERMS, seconds per step): the true
    step's compute and exposed communication, the landscape's split where one is hidden (else the cost
    model's own), scaled to the run's measured mean step and each off by up to `trace_noise` (at most 0.5).
    A trace measures the steps it saw: together the parts never exceed their mean (noise that would make
    them do so is scaled back, as a real trace's parts of one step cannot outgrow it)."""
    parts = land.step_parts(config, workload, predicted_s) if land is not None else model_parts(predicted_s)
    scale = mean_step_s / max(sum(parts.values()), 1e-12)
    error = min(0.5, max(0.0, float(opts.get("trace_noise", 0.05))))
    terms = {name: parts[part] * scale * (1.0 + error * unit_hash(spec.seed, "trace", spec.trial, spec.attempt, name))
             for name, part in (("compute", "compute"), ("exposed_communication", "communication"))}
    busy = sum(terms.values())
    return {name: seconds * min(1.0, mean_step_s / busy) for name, seconds in terms.items()} if busy > 0 else terms
