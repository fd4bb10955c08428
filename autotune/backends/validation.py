"""Checking what a launcher reports before it becomes a measurement.

A launcher is not trusted: its result line may hold strings where numbers belong, NaN, infinity,
negative or zero times, an MFU of a billion or a memory peak of 1e300 GiB. Stored as measured,
such a value would be ranked first, exported, and would steer the search (an absurd OOM peak
moves the OOM frontier). So every result goes through two checks:

- `parse_result` (the command and megatron backends' result JSON): types. A wrong type is a
  failed trial, never an exception in the controller.
- `impossible_result` (every backend, in the controller, after the missing metrics are derived):
  every number finite and positive, and physically possible on the study's GPU (MFU <= 1 at the
  study's precision, TFLOP/s <= the GPU's peak, memory <= a bound). The controller turns an
  impossible result into a failed trial whose message says which value and why.
"""

from __future__ import annotations

import json
import math
from typing import Any

from autotune._json import loads_flagged
from autotune._numbers import MEASURED_TERMS, is_number, is_positive_finite, measured_terms
from autotune.backends.base import TrialOutcome, TrialSpec, TrialStatus
from autotune.catalog import OOM_MEMORY_FACTOR

METRIC_KEYS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib")
RESULT_STATUSES = ("completed", "oom", "failed")
# A completed run held its peak in the GPU's memory: allow 10% for GB/GiB and reserved/total slack.
COMPLETED_MEMORY_SLACK = 1.10
MAX_ERROR_CHARS = 20_000
# A step time and a throughput reported together may be averaged over slightly different steps.
CONSISTENCY_FACTOR = 1.25
# Below this share of the GPU's peak no training step runs (a healthy one runs at 20-60%; 1e-4 is a
# step of hours for an 8B model on one node): such a figure is a unit error or a broken clock.
MIN_PEAK_SHARE = 1e-4
# One step of a run (warm-up included: a first step waits for NCCL set-up, compilation, a checkpoint) may be
# far slower than the run's mean: a single step is impossible only below this share of the peak (a step of
# weeks for llama3_8b at 16 sequences on 8 GPUs), or above the peak.
MIN_STEP_PEAK_SHARE = 1e-7
# Launchers count FLOPs their own way: 6 x active parameters x tokens leaves attention out (a third of this
# package's count for qwen3_30b at 32k tokens), older Megatron counts the full attention square and no sliding
# window (2-3x this package's for GPT-OSS at 32k-128k). A reported TFLOP/s or MFU more than this factor off
# what the throughput implies in this package's convention is replaced by that (controller.outcomes): a
# convention is no reason to discard a run, and the store keeps one convention where it must choose.
TFLOPS_BASIS_FACTOR = 2.0
# A completed run's peak under this share of the memory model's prediction is no measurement: the weights,
# gradients and optimizer state the model counts are a third or more of a prediction, its error is +-10-20%.
MIN_PREDICTED_PEAK_SHARE = 0.1


def step_report(value: Any) -> tuple[int, float] | None:
    """(step, seconds) of a launcher's step line (a parsed JSON object): JSON numbers only, as in the result line
    (an adversarial pass: int() and float() read "６０" as 60 and true as 1), the time positive and finite; None for
    anything else."""
    if not isinstance(value, dict) or isinstance(value, FlawedObject):  # a key twice: which step_time_s is meant?
        return None
    step, seconds = value.get("step"), value.get("step_time_s")
    if not (isinstance(step, int) and not isinstance(step, bool) and is_number(seconds) and is_positive_finite(seconds)):
        return None
    return step, float(seconds)


def max_step_reports(spec: TrialSpec) -> int:
    """The most step times a run of `spec` can report: its warm-up and measured steps, twice over and a few more
    (a launcher may count an evaluation or a first step twice). More is no run of this spec: an adversarial pass
    sent 2,000,000 step lines for a run of 8 steps (3.3 GB of controller memory, 80 MB of store)."""
    return 2 * (spec.warmup_steps + spec.measured_steps) + 16


class FlawedObject(dict):
    """A JSON object that parsed but holds what no honest launcher writes (a key given twice: which one
    counts?; an integer of thousands of digits): as a result it makes an invalid result, never a guess."""

    def __init__(self, value: dict[str, Any], problem: str):
        super().__init__(value)
        self.problem = problem


def json_object(text: str | None) -> dict[str, Any] | None:
    """The JSON object a launcher wrote on one line or in one file (a FlawedObject when it holds a key twice
    or an absurd integer); None for anything else (not JSON, not an object, empty, or 100,000 nested
    brackets: RecursionError)."""
    try:
        value, problem = loads_flagged(text) if text else (None, None)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return FlawedObject(value, problem) if problem else value


def _failed(spec: TrialSpec, times: list[float], wall_s: float, message: str) -> TrialOutcome:
    return TrialOutcome(spec.trial, TrialStatus.FAILED, step_times_s=times, wall_time_s=wall_s,
                        error=f"invalid result: {message}")


def _as_text(value: Any) -> str | None:
    """A launcher's `error` as one string, whatever JSON type it sent (a list or a mapping too)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_ERROR_CHARS]


def _type_problem(result: dict[str, Any]) -> str | None:
    if isinstance(result, FlawedObject):
        return result.problem
    for key in (*METRIC_KEYS, "wall_time_s"):
        value = result.get(key)
        if value is not None and not is_number(value):
            return f"{key} must be a number, got {json.dumps(value, default=str)[:80]}"
    times = result.get("step_times_s")
    if times is not None and (not isinstance(times, list) or not all(is_number(t) for t in times)):
        return "step_times_s must be a list of numbers"
    artifacts = result.get("artifacts")
    if artifacts is not None and (not isinstance(artifacts, dict)
                                  or not all(isinstance(v, str) for v in artifacts.values())):
        return "artifacts must map names to file paths (strings)"
    terms = result.get("measured_terms_s")
    if terms not in (None, {}) and measured_terms(terms) is None:  # {}: an outcome record without a trace
        return (f"measured_terms_s must map {' and/or '.join(MEASURED_TERMS)} to seconds per step (finite, >= 0), "
                f"got {json.dumps(terms, default=str)[:80]}")
    return None


def parse_result(spec: TrialSpec, result: dict[str, Any], times: list[float], wall_s: float) -> TrialOutcome:
    """The TrialOutcome of a launcher's result JSON object; wrong types make a failed trial."""
    status = str(result.get("status", "completed")).lower()
    if status not in RESULT_STATUSES:
        return _failed(spec, times, wall_s, f"unknown status {status[:40]!r}")
    problem = _type_problem(result)
    if problem:
        return _failed(spec, times, wall_s, problem)
    reported = result.get("step_times_s")
    if reported is not None and len(reported) > max_step_reports(spec):
        return _failed(spec, times[:max_step_reports(spec)], wall_s,
                       f"step_times_s holds {len(reported):,} steps; a run of {spec.warmup_steps} warm-up and "
                       f"{spec.measured_steps} measured steps reports at most {max_step_reports(spec)}")
    step_time = result.get("step_time_s")
    if status == "completed" and step_time is None:
        if len(times) <= spec.warmup_steps:  # a throughput alone is no measurement of this run's step
            return _failed(spec, times, wall_s, "the result says completed but has no step_time_s (nor "
                                                "step lines past the warm-up to take it from)")
        measured = times[spec.warmup_steps:]
        step_time = sum(measured) / len(measured)
    steps_s = [_float(t) for t in (reported or times)][spec.warmup_steps:]
    plausible_steps = bool(steps_s) and all(is_positive_finite(t) for t in steps_s)
    step_s = _float(step_time)
    if status == "completed" and plausible_steps and is_positive_finite(step_s):
        # the step time and the run's own measured steps describe one run (an adversarial pass: a result of 28 s
        # over steps of 600 s was ranked first, exported, and pruned every honest run after it). Their mean, what
        # every honest launcher reports, lies between the fastest and the slowest (review: a test against the
        # median refused honest runs with one slow step)
        low, high = min(steps_s), max(steps_s)
        if not low / CONSISTENCY_FACTOR <= step_s <= high * CONSISTENCY_FACTOR:
            return _failed(spec, times, wall_s, f"step_time_s {step_s:.6g} lies outside the "
                                                f"{low:.6g}..{high:.6g} s of the measured steps the run reports")
    wall = _float(result.get("wall_time_s"))
    if is_positive_finite(wall) and wall_s > 0:
        # the launcher may leave its start-up out, but its run cannot have lasted longer than the process
        wall = min(wall, wall_s)
    floor_s = sum(steps_s) if plausible_steps else (
        spec.measured_steps * step_s if status == "completed" and is_positive_finite(step_s) else 0.0)
    if is_positive_finite(wall) and wall < 0.99 * floor_s:
        # nor shorter than the measured steps it reports, or without a list, than its measured steps at its step
        # time (an adversarial pass: 1e-300 s, then 1e-9 s without step times, went into the GPU-hours and kept
        # --max-gpu-hours from ever stopping the study; a launcher may time the measured steps alone, review):
        # the process's own wall time then
        wall = None
    return _outcome(spec.trial, status, result, step_time, result.get("step_times_s") or times,
                    wall if is_positive_finite(wall) else wall_s)


def _outcome(trial: int, status: str, result: dict[str, Any], step_time: Any, step_times: list,
             wall_time_s: float) -> TrialOutcome:
    """The TrialOutcome of a type-checked result object (_type_problem passed): numbers as floats."""
    return TrialOutcome(trial, TrialStatus(status), step_time_s=_float(step_time),
                        tokens_per_s_per_gpu=_float(result.get("tokens_per_s_per_gpu")),
                        tflops_per_gpu=_float(result.get("tflops_per_gpu")), mfu=_float(result.get("mfu")),
                        peak_mem_gib=_float(result.get("peak_mem_gib")), step_times_s=[_float(t) for t in step_times],
                        wall_time_s=wall_time_s, error=_as_text(result.get("error")),
                        artifacts={str(k): v for k, v in (result.get("artifacts") or {}).items()},
                        measured_terms_s=measured_terms(result.get("measured_terms_s")) or {})


def recheck(spec: TrialSpec, outcome: TrialOutcome, held_s: float) -> TrialOutcome:
    """A harvested outcome record (a file anyone who can write the run folder can change) through parse_result's
    rules for `spec` (review: a forged record's wall time of 1e-9 s or step time of 28 s over steps of 600 s passed
    the type checks alone); `held_s` the time the run held its GPUs as the controller saw it, charged when the
    record's own wall time cannot be the run's."""
    if outcome.status.value not in RESULT_STATUSES:
        return outcome
    result = {"status": outcome.status.value, **{k: getattr(outcome, k) for k in METRIC_KEYS},
              "step_times_s": outcome.step_times_s or None, "wall_time_s": outcome.wall_time_s, "error": outcome.error,
              "artifacts": outcome.artifacts or None, "measured_terms_s": outcome.measured_terms_s or None}
    # the record's own wall time stands unless it cannot be the run's: the run went on after its controller
    # stopped heartbeating, so what the controller saw is a floor, not a cap
    own = outcome.wall_time_s if is_positive_finite(outcome.wall_time_s) else 0.0
    return parse_result(spec, result, [], max(held_s, own))


def outcome_from_record(data: Any) -> TrialOutcome:
    """A TrialOutcome read back from a run folder's outcome file (runs.harvest). That file is written by
    the backend, but anyone who can write the folder can change it, and it is read after a controller
    died: it gets the launcher's type checks, and a ValueError when it fails them."""
    if not isinstance(data, dict):
        raise ValueError("an outcome record must be a JSON object")
    status = data.get("status")
    if status not in {s.value for s in TrialStatus}:
        raise ValueError(f"unknown status {str(status)[:40]!r}")
    problem = _type_problem(data)
    if problem or not isinstance(data.get("trial"), int) or isinstance(data.get("trial"), bool):
        raise ValueError(problem or "trial must be an integer")
    wall = _float(data.get("wall_time_s"))
    return _outcome(data["trial"], status, data, data.get("step_time_s"), data.get("step_times_s") or [],
                    wall if wall is not None and math.isfinite(wall) and wall >= 0 else 0.0)


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range: as impossible as (signed) infinity
        return math.inf if value > 0 else -math.inf


def peak_tflops(gpu, precision: str) -> float:
    """The GPU's dense peak at the study's precision (BF16 when the GPU has no such peak)."""
    return float(gpu.peak_tflops.get(precision, gpu.bf16_peak_tflops))


def memory_bound_gib(gpu, status: str) -> float:
    factor = OOM_MEMORY_FACTOR if status == "oom" else COMPLETED_MEMORY_SLACK
    return gpu.memory_gib * factor


def _step_tflops(step_s: float, workload, tp: int) -> float:
    """The model TFLOP/s per GPU that a step of `step_s` seconds implies at the workload's global batch."""
    from autotune.cost.flops import model_tflops_per_gpu, tokens_per_s_per_gpu

    w = workload
    tokens = tokens_per_s_per_gpu(w.global_batch_size, w.seq_length, w.cluster.gpus, step_s)
    return model_tflops_per_gpu(w.model.architecture, w.seq_length, tp, tokens)


def possible_step(step_s: float, workload, tp: int) -> bool:
    """A step time a training step can take: its model TFLOP/s within MIN_STEP_PEAK_SHARE..1 of the GPU's peak."""
    if not is_positive_finite(step_s):
        return False
    peak = peak_tflops(workload.cluster.gpu, workload.precision)
    return MIN_STEP_PEAK_SHARE * peak <= _step_tflops(step_s, workload, tp) <= peak


# A trace's compute time per step carries at least the step's model FLOPs at the GPU's peak; half of that is the
# floor, for what the count and the traced rank may differ by (a rank's share of uneven pipeline stages or experts)
TRACE_COMPUTE_MIN_SHARE = 0.5


def possible_trace_compute(compute_s: float | None, step_s: float, workload, tp: int) -> bool:
    """A measured compute time per step (a trace's) that the step's work allows: at least TRACE_COMPUTE_MIN_SHARE
    of the step's model FLOPs at the GPU's peak (found by an adversarial pass: a launcher's `compute: 1e-300`
    passed, an infinite TFLOP/s, and pulled the calibration's compute and optimizer terms to their bounds)."""
    if compute_s is None:
        return True
    peak = peak_tflops(workload.cluster.gpu, workload.precision)
    return compute_s >= TRACE_COMPUTE_MIN_SHARE * _step_tflops(step_s, workload, tp) * step_s / peak


def possible_step_times(step_times_s: list[float], workload, tp: int) -> list[float]:
    """The step times a training step can take (possible_step): what a failed, pruned or timed-out run
    keeps of what its launcher reported (a completed one is refused whole when one step is impossible)."""
    return [t for t in step_times_s if possible_step(t, workload, tp)]


def impossible_result(status: str, metrics: dict[str, float | None], step_times_s: list[float], workload,
                      tp: int, predicted_peak_gib: float | None = None) -> str | None:
    """Why the reported (and derived) numbers cannot be a real measurement, or None when they can.

    `metrics` holds the five METRIC_KEYS after the controller derived the missing ones; MFU there
    is against the BF16 peak, so its bound is the study precision's peak over the BF16 peak.
    Besides each number's own bounds: a step time and a throughput reported together must describe
    the same run (CONSISTENCY_FACTOR), and a run slower than MIN_PEAK_SHARE of the GPU's peak is no
    training step; each step time (warm-up included) must lie within MIN_STEP_PEAK_SHARE..1 of the
    peak (a first step 1,000x slower than the others is still far inside). A completed run's peak may not be below
    MIN_PREDICTED_PEAK_SHARE of `predicted_peak_gib` (the memory model's prediction, when the caller
    has one). A TFLOP/s or MFU in another FLOP convention than the throughput's is not refused here
    (TFLOPS_BASIS_FACTOR). (A step is not compared with the launcher process's lifetime: a launcher
    may report a run it did not wait for, as the test launchers do.)
    """
    from autotune.cost.flops import model_tflops_per_gpu, tokens_per_s_per_gpu

    for key in METRIC_KEYS:
        value = metrics.get(key)
        if value is not None and not is_positive_finite(value):
            return f"{key} = {value!r} (must be a finite number > 0)"
    if not all(is_positive_finite(t) for t in step_times_s):
        return "step_times_s holds a value that is not a finite number > 0"
    if status == "completed" and metrics.get("step_time_s") is None:
        return "completed without a step time"
    gpu, w = workload.cluster.gpu, workload
    peak = peak_tflops(gpu, w.precision)
    implied_tflops = {"tflops_per_gpu": metrics.get("tflops_per_gpu")}
    if metrics.get("tokens_per_s_per_gpu"):
        implied_tflops["tokens_per_s_per_gpu"] = model_tflops_per_gpu(
            w.model.architecture, w.seq_length, tp, metrics["tokens_per_s_per_gpu"])
    if metrics.get("step_time_s"):
        implied_tflops["step_time_s"] = _step_tflops(metrics["step_time_s"], workload, tp)
    for key, tflops in implied_tflops.items():
        if tflops is not None and not tflops <= peak:
            return (f"{key} = {metrics[key]:.4g} implies {tflops:.4g} TFLOP/s per GPU, above the "
                    f"{gpu.name} peak of {peak:g} at {w.precision}")
        if tflops is not None and tflops < MIN_PEAK_SHARE * peak:
            return (f"{key} = {metrics[key]:.4g} implies {tflops:.3g} TFLOP/s per GPU, under "
                    f"{MIN_PEAK_SHARE:.0e} of the {gpu.name} peak: no training step runs that slowly")
    for step_s in step_times_s:
        if not possible_step(step_s, workload, tp):
            return (f"step_times_s holds a step of {step_s:.4g} s: at {w.global_batch_size} sequences per step "
                    f"that is outside {MIN_STEP_PEAK_SHARE:.0e}..1 of the {gpu.name} peak of {peak:g} at {w.precision}")
    step, tokens = metrics.get("step_time_s"), metrics.get("tokens_per_s_per_gpu")
    if step and tokens:
        from_step = tokens_per_s_per_gpu(w.global_batch_size, w.seq_length, w.cluster.gpus, step)
        if not 1 / CONSISTENCY_FACTOR <= tokens / from_step <= CONSISTENCY_FACTOR:
            return (f"tokens_per_s_per_gpu = {tokens:.4g} contradicts step_time_s = {step:.4g} "
                    f"({from_step:.4g} tokens/s/GPU at this global batch)")
    mfu_bound = peak / gpu.bf16_peak_tflops
    if metrics.get("mfu") is not None and metrics["mfu"] > mfu_bound:
        return f"mfu = {metrics['mfu']:.4g} (at most {mfu_bound:g}: the GPU's peak)"
    bound = memory_bound_gib(gpu, status)
    peak_gib = metrics.get("peak_mem_gib")
    if peak_gib is not None and peak_gib > bound:
        return f"peak_mem_gib = {peak_gib:.4g} above the {bound:.1f} GiB bound of a {gpu.memory_gib:g} GiB {gpu.name}"
    if (status == "completed" and peak_gib is not None and is_positive_finite(predicted_peak_gib)
            and peak_gib < MIN_PREDICTED_PEAK_SHARE * predicted_peak_gib):
        return (f"peak_mem_gib = {peak_gib:.4g} under {MIN_PREDICTED_PEAK_SHARE:g} of the {predicted_peak_gib:.1f} "
                f"GiB the memory model predicts for this layout (its weights and optimizer state alone are more)")
    return None
