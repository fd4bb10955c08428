"""Outcomes: what a finished trial's result means for SQL, Optuna and the search.

Three pure pieces the loop composes: `derive_metrics` fills what a backend left out, `checked`
refuses physically impossible numbers, `verdict` names why a trial ended (a table, tested as one).
`tell` is the one place that maps a finished trial's status to what Optuna is told (state, value,
constraint and user attributes); layouts rejected before dispatch are not Optuna trials.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.backends import TrialOutcome, TrialStatus
from autotune._numbers import is_positive_finite
from autotune.backends.validation import (METRIC_KEYS, TFLOPS_BASIS_FACTOR, impossible_result, peak_tflops,
                                          possible_step_times, possible_trace_compute)
from autotune.config import LayoutConfig, Workload
from autotune.controller.screening import constraint_kind
from autotune.cost.flops import model_tflops_per_gpu, tokens_per_s_per_gpu

# status -> the reason stored with the trial (None: nothing to explain)
VERDICTS: dict[str, str | None] = {
    "completed": None,
    "oom": "out_of_memory",
    "pruned": "slow_branch",
    "timeout": "timeout",
    "failed": "failed",
    "lost": "lost",
}
IMPOSSIBLE = ("impossible result", "invalid result")  # how validation's refusals begin
MESSAGE_CHARS = 500  # of a failure's message kept as an Optuna user attribute


def verdict(status: str, error: str | None, saw_steps: bool) -> str | None:
    """The reason stored with a finished trial: the table above, except that a failure whose numbers
    were impossible is `invalid_result`, and a trial stopped before any step is `cancelled`."""
    if status == "failed" and (error or "").startswith(IMPOSSIBLE):
        return "invalid_result"
    if status == "pruned" and not saw_steps:
        return "cancelled"
    return VERDICTS[status]


def derive_metrics(outcome: TrialOutcome, workload: Workload, config: LayoutConfig) -> dict[str, float | None]:
    """Fill throughput, TFLOP/s and MFU that a backend left out, from step time and model FLOPs; a
    reported TFLOP/s more than TFLOPS_BASIS_FACTOR off what the throughput implies in this package's FLOP
    convention is replaced by that, and then an MFU that is not that TFLOP/s over BF16's or the precision's
    peak (within the same factor) is too: launchers count FLOPs their own way (backends.validation)."""
    metrics = outcome.metrics()
    step = metrics["step_time_s"]
    if step:
        w = workload
        tokens = metrics["tokens_per_s_per_gpu"] or tokens_per_s_per_gpu(w.global_batch_size, w.seq_length,
                                                                         w.cluster.gpus, step)
        metrics["tokens_per_s_per_gpu"] = tokens
        metrics.update(flops_in_one_convention(metrics, workload, config))
    return metrics


def flops_in_one_convention(metrics: dict, workload: Workload, config: LayoutConfig) -> dict[str, float]:
    """TFLOP/s and MFU for a run of `metrics["tokens_per_s_per_gpu"]`: the reported ones where they agree
    with it within TFLOPS_BASIS_FACTOR (an MFU against BF16's peak or the precision's), this package's
    count where they are missing or do not (derive_metrics)."""
    w = workload
    ours = model_tflops_per_gpu(w.model.architecture, w.seq_length, config.tp, metrics["tokens_per_s_per_gpu"])
    tflops, mfu = metrics.get("tflops_per_gpu"), metrics.get("mfu")
    if not _agrees(tflops, ours, 1.0):
        tflops, mfu = ours, None
    bf16 = w.cluster.gpu.bf16_peak_tflops
    precision_share = bf16 / peak_tflops(w.cluster.gpu, w.precision)  # an MFU against the precision's peak
    if not (_agrees(mfu, tflops / bf16, 1.0) or _agrees(mfu, tflops / bf16, precision_share)):
        mfu = tflops / bf16
    return {"tflops_per_gpu": tflops, "mfu": mfu}


def _agrees(reported: float | None, implied: float, scale: float) -> bool:
    """True when `reported` is a finite positive number within TFLOPS_BASIS_FACTOR of implied * scale."""
    if reported is None or not is_positive_finite(reported) or not is_positive_finite(implied):
        return False
    return 1 / TFLOPS_BASIS_FACTOR <= reported / (implied * scale) <= TFLOPS_BASIS_FACTOR


def checked(outcome: TrialOutcome, workload: Workload, config: LayoutConfig,
            predicted_peak_gib: float | None = None) -> tuple[TrialOutcome, dict]:
    """The outcome and its metrics (missing ones derived), or a failed outcome when the numbers are
    impossible (a hostile or broken launcher: see backends.validation). `predicted_peak_gib`: the memory
    model's prediction stored with the trial, a floor for a completed run's measured peak."""
    metrics = derive_metrics(outcome, workload, config)
    if outcome.status not in (TrialStatus.COMPLETED, TrialStatus.OOM):
        peak_ok = impossible_result("failed", {"peak_mem_gib": metrics["peak_mem_gib"]}, [], workload,
                                    config.tp) is None
        kept = dataclasses.replace(outcome, step_times_s=possible_step_times(outcome.step_times_s, workload, config.tp))
        return kept, {**metrics, "peak_mem_gib": metrics["peak_mem_gib"] if peak_ok else None}
    status = outcome.status.value  # what the launcher reported is named first, then what follows from it
    problem = (impossible_result(status, outcome.metrics(), outcome.step_times_s, workload, config.tp,
                                 predicted_peak_gib)
               or impossible_result(status, metrics, outcome.step_times_s, workload, config.tp, predicted_peak_gib))
    if problem is None:
        compute = (outcome.measured_terms_s or {}).get("compute")
        if is_positive_finite(metrics["step_time_s"]) and isinstance(compute, (int, float)) and \
                not possible_trace_compute(float(compute), metrics["step_time_s"], workload, config.tp):
            # a trace's breakdown is advisory: left out (no calibration from it), the run kept
            outcome = dataclasses.replace(outcome, measured_terms_s={})
        return outcome, metrics
    failed = dataclasses.replace(outcome, status=TrialStatus.FAILED, step_times_s=[],
                                 error=f"impossible result ({problem}); reported status {outcome.status.value}")
    return failed, {key: None for key in metrics}


def optuna_attrs(status: str, reason: str | None, message: str | None, metrics: dict, origin: str | None = None,
                 strategy: str | None = None) -> dict:
    """The user attributes a finished trial's Optuna trial gets: what autotune recorded of it (a None is
    left out by the adapter, which adds the backend)."""
    attrs = {"origin": origin, "strategy": strategy, "status": status, "reason": reason,
             **{key: metrics.get(key) for key in METRIC_KEYS}}
    if message and status != "completed":
        attrs["message"] = message[:MESSAGE_CHARS]
    return attrs


def tell(optuna, number: int | None, status: str, metrics: dict, error: str | None, step_times_s: list[float],
         workload: Workload, warmup_steps: int, reason: str | None = None, origin: str | None = None,
         strategy: str | None = None) -> None:
    """Tell Optuna (the study of record) how trial `number` ended, with `optuna_attrs` as its user
    attributes. OOMs (and a proposal refused in a race between controllers, or a stale one of a study
    numbered before revision 0004: "rejected") are infeasible (a constraint, never FAIL); a slow-branch
    prune is PRUNED with its measured throughput."""
    if number is None:
        return
    attrs = optuna_attrs(status, reason, error, metrics, origin, strategy)
    if status == "rejected":
        optuna.tell_infeasible(number, constraint_kind(reason or "rejected"), 1.0, attrs)
    elif status == "completed" and metrics.get("tokens_per_s_per_gpu"):
        optuna.tell_complete(number, metrics["tokens_per_s_per_gpu"], attrs)
    elif status == "oom":
        limit = workload.cluster.gpu.memory_gib
        over = (metrics.get("peak_mem_gib") or limit * 1.01) - limit
        optuna.tell_infeasible(number, "memory", max(over, 0.01), attrs)
    elif status == "pruned":
        steps = step_times_s[warmup_steps:] or step_times_s
        value = None
        if steps:
            w = workload
            value = tokens_per_s_per_gpu(w.global_batch_size, w.seq_length, w.cluster.gpus, float(np.median(steps)))
        optuna.tell_pruned(number, max(1, len(step_times_s)), value, attrs)
    else:
        optuna.tell_fail(number, attrs)
