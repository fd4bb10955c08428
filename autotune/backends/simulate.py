"""The `simulate` backend: the analytical cost model stands in for a GPU run.

A layout the model says does not fit ends as OOM (so the OOM path runs without a GPU); the others
report warm-up and measured steps with optional measurement noise. For benchmarks the backend can
also hide a *landscape* that is not the tuner's own model: seeded per-knob-value biases, per-layout
noise and a memory-model error, which the controller never sees (they live in backend options).

Options (all optional):
  noise             relative std of per-step measurement noise (default 0.01)
  landscape_seed    seed of the hidden landscape; absent = the cost model itself
  knob_bias         max relative per-knob-value bias of the hidden landscape (default 0.12)
  layout_noise      max relative per-layout deviation (default 0.02)
  memory_error      max relative error of the memory model (default 0.05)
  startup_s         simulated seconds before the first step (model build, NCCL init; default 90)
  seconds_per_trial real seconds one trial takes, to watch a study run (default 0.05)
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np

from autotune.backends.base import Backend, Reporter, StepReport, TrialOutcome, TrialSpec, TrialStatus
from autotune.config import KNOBS, LayoutConfig, Workload


def _unit_hash(*parts: object) -> float:
    """A deterministic number in [-1, 1) from the parts (stable across processes and runs)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 63 - 1.0


class HiddenLandscape:
    """Multiplicative throughput and memory distortions of the cost model, fixed by a seed."""

    def __init__(self, seed: int, knob_bias: float = 0.12, layout_noise: float = 0.02,
                 memory_error: float = 0.05) -> None:
        self.seed, self.knob_bias, self.layout_noise, self.memory_error = seed, knob_bias, layout_noise, memory_error

    def speed_factor(self, config: LayoutConfig) -> float:
        values = config.to_dict()
        factor = 1.0
        for knob in KNOBS:
            factor *= 1.0 + self.knob_bias * _unit_hash(self.seed, "knob", knob, values[knob])
        return factor * (1.0 + self.layout_noise * _unit_hash(self.seed, "layout", config.key()))

    def speed_factors(self, configs: list[LayoutConfig]) -> np.ndarray:
        """speed_factor of many layouts (knob factors computed once per knob value)."""
        per_value: dict[tuple, float] = {}
        out = np.empty(len(configs))
        for j, config in enumerate(configs):
            values = config.to_dict()
            factor = 1.0
            for knob in KNOBS:
                key = (knob, values[knob])
                if key not in per_value:
                    per_value[key] = 1.0 + self.knob_bias * _unit_hash(self.seed, "knob", knob, values[knob])
                factor *= per_value[key]
            out[j] = factor * (1.0 + self.layout_noise * _unit_hash(self.seed, "layout", config.key()))
        return out

    def memory_factor(self, config: LayoutConfig) -> float:
        structural = (config.tp, config.pp, config.cp, config.ep, config.etp)
        return 1.0 + self.memory_error * _unit_hash(self.seed, "memory", structural)


def workload_from_spec(spec: TrialSpec) -> Workload:
    from autotune.space import load_space, make_workload

    space = load_space(spec.backend_options.get("space_source") or spec.model)
    return make_workload(space, gpus=spec.gpus, gpus_per_node=spec.gpus_per_node, gpu=spec.gpu,
                         global_batch_size=spec.global_batch_size, seq_length=spec.seq_length,
                         precision=spec.precision)


class SimulateBackend(Backend):
    name = "simulate"

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        from autotune.cost import estimate

        opts = {**self.options, **spec.backend_options}
        workload = workload_from_spec(spec)
        config = LayoutConfig.from_mapping(spec.config)
        predicted = estimate(workload, config)
        step_time_s = predicted.step_time_s
        peak_gib = predicted.peak_mem_gib
        if opts.get("landscape_seed") is not None:
            land = HiddenLandscape(int(opts["landscape_seed"]), float(opts.get("knob_bias", 0.12)),
                                   float(opts.get("layout_noise", 0.02)), float(opts.get("memory_error", 0.05)))
            step_time_s /= land.speed_factor(config)
            peak_gib *= land.memory_factor(config)
        startup_s = float(opts.get("startup_s", 90.0))
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
            slowdown = 3.0 if step == 1 else (1.1 if warmup else 1.0)
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
        return TrialOutcome(spec.trial, TrialStatus.COMPLETED, step_time_s=mean_step,
                            peak_mem_gib=peak_gib, step_times_s=times, wall_time_s=startup_s + sum(times))
