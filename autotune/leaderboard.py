"""Leaderboards and study summaries, built from the SQL store only (never Optuna or Ray).

Completed trials rank by tokens/s/GPU; then the other dispatched trials by number. The recipe's own
layout (the baseline, when it was measured) gives every row a speed-up; a board cut to its top rows
keeps the baseline's row in `pinned`, so the reference of "vs recipe" is always on screen.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from autotune.config import LayoutConfig
from autotune.controller.notes import BASELINE, MEANINGS
from autotune.controller.recommend import VALIDATION, RunNoise, study_recommendation
from autotune.storage import Repository, Study, Trial, TrialOrigin
from autotune.storage.repository import gpu_hour_cap_reached, heartbeat_ahead_s

# new columns go last: a script reading the CSV by position keeps working
COLUMNS = ("trial", "status", "reason", "config", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_sd",
           "tflops_per_gpu", "mfu", "peak_mem_gib", "gpu_seconds", "speedup_vs_baseline", "note", "stopped", "source",
           "verdict", "estimated_tokens_per_s_per_gpu", "partial_tokens_per_s_per_gpu")


# What a study's numbers are, by backend: only backends that run the training measure anything.
METRICS_SOURCES = {"simulate": "simulated", "replay": "replayed"}


def metrics_source(backend: str, origin: str = "study") -> str:
    """"measured", "simulated" (the cost model stood in for a run) or "replayed" (looked up in a table of
    runs made elsewhere). An imported log is a measurement whatever the study's backend."""
    return "measured" if origin == "imported" else METRICS_SOURCES.get(backend, "measured")


@dataclass
class Board:
    study: Study
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    # rows cut off by `top` that a reader still needs: the recipe's own layout (the baseline)
    pinned: list[dict[str, Any]] = field(default_factory=list)


def row_note(trial: Trial) -> str | None:
    """A row's note: the strategy's word for the run, else its origin when it is not the study's own (imported,
    validation)."""
    return trial.strategy_note or (trial.origin if trial.origin != "study" else None)


def _row(trial: Trial, baseline_speed: float | None, noise: RunNoise | None = None, backend: str = "") -> dict[str, Any]:
    speed = trial.tokens_per_s_per_gpu if trial.status == "completed" else None
    return {
        "trial": trial.number, "status": trial.status, "reason": trial.reason, "config": trial.config,
        # a run nothing heartbeats: the study's interruption (SIGTERM, Ctrl-C) cancelled it, or its controller died;
        # its record stays dispatched for `resume` or a live controller to run again (found by review: shown as
        # running, and `--watch` never ended)
        "stopped": _stopped(trial),
        "step_time_s": trial.step_time_s if speed else None, "tokens_per_s_per_gpu": speed,
        # how far another run of this layout may land: one run-to-run sd (recommend.RunNoise)
        "tokens_per_s_per_gpu_sd": noise.run_sd(speed) if speed and noise else None,
        "tflops_per_gpu": trial.tflops_per_gpu if speed else None, "mfu": trial.mfu if speed else None,
        "peak_mem_gib": trial.peak_mem_gib, "gpu_seconds": trial.gpu_seconds,
        "speedup_vs_baseline": _ratio(speed, baseline_speed),
        "note": row_note(trial), "message": trial.message, "implied_by_trial": trial.implied_by_trial,
        # measured, simulated or replayed: in every row, so a CSV read alone says it (review: only JSON did)
        "source": metrics_source(backend, trial.origin) if trial.dispatched else None,  # a rejected one never ran
    }


RECOMMENDED = "recommended"


def _with_verdict(row: dict[str, Any], trial: Trial, pick: Any) -> dict[str, Any]:
    """A completed row with what the study's answer makes of it (found by a new-user pass: the recommended row was
    marked nowhere, and faster rows above it said nothing of why they lost):
    - `verdict`: "recommended" (a run of the recommended layout), "at risk: WHY" (a layout the study does not
      recommend as safe: an OOM among its runs, a peak inside the memory margin), else None;
    - `estimated_tokens_per_s_per_gpu`: its layout's pooled estimate, what the recommendation ranks layouts by
      (screening runs; None for a validation run, or where the backend repeats exactly)."""
    row["verdict"] = row["estimated_tokens_per_s_per_gpu"] = None
    if pick is None or row["status"] != "completed":
        return row
    if trial.origin != TrialOrigin.VALIDATION:
        layout = pick.layout_of(trial.config_key)
        row["estimated_tokens_per_s_per_gpu"] = layout.estimate_tokens_per_s_per_gpu if layout is not None else None
    risk = pick.trial_risk(trial)
    if trial.config_key == pick.trial.config_key:
        row["verdict"] = RECOMMENDED + (f", at risk: {risk}" if risk else "")
    elif risk:
        row["verdict"] = f"at risk: {risk}"
    return row


def _with_partial(row: dict[str, Any], trial: Trial, workload: dict[str, Any], warmup_steps: int) -> dict[str, Any]:
    """A pruned run's throughput over the measured steps it made before it was cut short (`partial_tokens_per_s_
    per_gpu`, from their median step, as the pruner judged it; None without measured steps): found by a new-user
    pass, pruned runs were on no chart, although they are most of a study's runs at times. The store has checked
    the workload's counts and the step times (positive)."""
    measured = list(trial.step_times_s)[warmup_steps:]
    row["partial_tokens_per_s_per_gpu"] = None
    if row["status"] == "pruned" and measured:
        import statistics

        from autotune.cost.flops import tokens_per_s_per_gpu  # the cost package's import, for pruned rows only

        row["partial_tokens_per_s_per_gpu"] = tokens_per_s_per_gpu(
            workload["global_batch_size"], workload["seq_length"], workload["gpus"], statistics.median(measured))
    return row


def verdict_text(row: dict[str, Any], summary: dict[str, Any]) -> str:
    """What a row's note says of the study's answer: its verdict, or for a run faster than the recommendation that
    is not at risk, the pooled estimate it lost on (a single lucky run is not the layout's speed)."""
    if row.get("verdict"):
        return row["verdict"]
    if row.get("partial_tokens_per_s_per_gpu"):
        return f"{row['partial_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU over its measured steps before it was cut short"
    speed, estimate, best = (row.get("tokens_per_s_per_gpu"), row.get("estimated_tokens_per_s_per_gpu"),
                             summary.get("best_estimated_tokens_per_s_per_gpu"))
    if not (speed and speed > (summary.get("best_tokens_per_s_per_gpu") or 0)):
        return ""
    if estimate and best and estimate < best:
        return f"estimated {estimate:,.0f} with its similar layouts' runs, below the recommended {best:,.0f}"
    if summary.get("validation_runs"):  # the longer validation runs reversed the screening's order
        return "not recommended: the validation runs decided (see the validation line)"
    return ""


def _stopped(trial: Trial) -> bool:
    """A dispatched run that no controller heartbeats any more, by the store's rule of a run to adopt
    (storage.repository._heartbeat_stale): its study's interruption cancelled it, or its controller died. Another
    controller of the same study (several may share one PostgreSQL study) keeps heartbeating its own runs: those
    run. In a running study too (the last note: a dead controller's run, left stale while the GPU-hour cap had no
    room for it, read `running` until a live controller adopted it)."""
    if trial.status != "dispatched":
        return False
    return trial.heartbeat_at is None or _stale_s(trial.heartbeat_at) is not None


def _stale_s(beat: dt.datetime) -> float | None:
    """Seconds since a heartbeat, when longer than the staleness limit the controllers themselves use (a
    run or controller that silent is taken for dead: its trials are adoptable); else None."""
    from autotune.controller.options import HEARTBEAT_S, STALE_AFTER_HEARTBEATS
    from autotune.storage.models import utcnow

    if beat.tzinfo is not None:
        beat = beat.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if heartbeat_ahead_s(beat) is not None:
        return math.inf  # dated past any clock skew: no live controller wrote it (the store's own rule)
    silent = (utcnow() - beat).total_seconds()
    return silent if silent > STALE_AFTER_HEARTBEATS * HEARTBEAT_S else None


def _ratio(speed: float | None, baseline_speed: float | None) -> float | None:
    """speed / baseline, None when either is missing or the ratio is no finite number (a hand-edited store's
    5e-324 baseline: JSON output and the dashboard's strict JSON have no Infinity)."""
    if not speed or not baseline_speed:
        return None
    ratio = speed / baseline_speed
    return ratio if math.isfinite(ratio) else None


def build(repo: Repository, study: Study, include_rejected: bool = False, top: int | None = None) -> Board:
    trials = repo.trials(study.id)
    dispatched = [t for t in trials if t.dispatched]
    baseline = next((t for t in dispatched if t.strategy_note == BASELINE), None)
    baseline_speed = baseline.tokens_per_s_per_gpu if baseline and baseline.status == "completed" else None
    completed = sorted((t for t in dispatched if t.status == "completed" and t.tokens_per_s_per_gpu),
                       key=lambda t: -t.tokens_per_s_per_gpu)
    others = [t for t in dispatched if t not in completed]
    shown = completed + others + ([t for t in trials if not t.dispatched] if include_rejected else [])
    # the study's answer: the best pooled estimate over the layouts that ran that keeps the memory headroom,
    # not the luckiest run (controller/recommend.py); with it, the run-to-run noise shown beside every
    # throughput (none where the backend's runs repeat exactly, such as replay)
    pick = study_recommendation(dispatched, study)
    noise = pick.noise if pick else None
    from autotune.controller.options import StudyOptions

    stored_options = StudyOptions.from_stored(study.options)

    def board_row(trial: Trial) -> dict[str, Any]:
        row = _row(trial, baseline_speed, noise, study.backend)
        return _with_partial(_with_verdict(row, trial, pick), trial, study.workload, stored_options.warmup_steps)

    rows = [board_row(t) for t in shown]
    if top is not None:
        rows = rows[:top]
    pinned = [board_row(baseline)] if baseline and baseline.number not in {r["trial"] for r in rows} else []
    counts = repo.counts(study.id)
    # dispatched, but nothing runs them: runs of the budget only, as counts["running"] is (review: a stale validation
    # run made `running` -1, and `leaderboard --watch` of a finished study waited for it for ever)
    stopped = sum(_stopped(t) for t in dispatched if t.origin == TrialOrigin.STUDY)
    cap = stored_options.max_gpu_hours
    # spent as the store sums it (Repository.gpu_seconds_spent), from the rows read above: no query per build
    spent_s = sum(t.gpu_seconds for t in dispatched if t.origin != TrialOrigin.IMPORTED)
    best = pick.trial if pick else None
    best_speed = pick.best.mean_tokens_per_s_per_gpu if pick else None
    summary = {
        "study": study.name, "model": study.model, "status": study.status, "budget": study.budget,
        "sampler": study.sampler, "backend": study.backend, "workload": study.workload,
        "dispatched": counts["dispatched"], "rejected_before_dispatch": counts["rejected"],
        "running": counts["running"] - stopped, "stopped": stopped,
        "completed": counts["completed"], "oom": counts["oom"],
        "pruned": counts["pruned"], "failed": counts["failed"], "timeout": counts["timeout"], "lost": counts["lost"],
        # runs outside the budget and the counts above: imported logs and the winner's validation runs
        "imported": counts["imported"], "validation": counts["validation"],
        "gpu_seconds": sum(t.gpu_seconds for t in dispatched),
        # of which the study's own runs (an imported log's are no spending of it): what its cap counts
        "spent_gpu_seconds": spent_s,
        # the study's --max-gpu-hours (None: no cap), and whether its runs have held it: no run starts
        "max_gpu_hours": cap, "gpu_hour_cap_reached": gpu_hour_cap_reached(spent_s, cap),
        "metrics_source": metrics_source(study.backend),  # of the study's runs, and so of its GPU time
        # benchmark-only settings the user turned on for every run: never part of a tuned result
        "benchmark_only": benchmark_label(study),
        "best_trial": best.number if best else None,
        "best_config": best.config if best else None,
        "best_tokens_per_s_per_gpu": best_speed,
        "best_runs": pick.best.runs if pick else 0,
        # standard error of that mean (the study's run-to-run noise over the square root of its runs)
        "best_tokens_per_s_per_gpu_se": noise.mean_se(best_speed, pick.best.counted_runs) if noise else None,
        # the run-to-run noise (log sd ~ relative sd) and how many layouts that ran more than once it comes from
        "run_noise_rel_sd": noise.log_std if noise else None,
        "run_noise_repeated_layouts": noise.repeated_layouts if noise else 0,
        # runs left out of that figure: far from their layout's other runs (a slow node, not noise)
        "run_noise_stragglers": list(noise.stragglers) if noise else [],
        # what the study judged it by: its runs pooled with the runs of layouts sharing its knob values
        "best_estimated_tokens_per_s_per_gpu": pick.best.estimate_tokens_per_s_per_gpu if pick else None,
        "best_peak_mem_gib": pick.best.peak_mem_gib if pick else None,
        "memory_headroom_gib": pick.headroom_gib if pick else None,
        # faster layouts that ran inside the memory margin: measured, but not recommended
        "risky_faster_trials": [r.trial.number for r in pick.risky] if pick else [],
        # why each is not recommended: an OOM in one of its runs, or its peak inside the margin
        "risky_faster_reasons": [pick.risk(r) for r in pick.risky] if pick else [],
        # None when the recommendation keeps the headroom; else why it is at risk (no layout kept it)
        "best_risk": None if pick is None or pick.safe else pick.risk(pick.best),
        # a running study whose controller stopped heartbeating (killed, its machine gone): `resume` continues it
        "controller_silent_s": controller_silence_s(study),
        # its heartbeat is dated past any clock skew (a hand edit, a broken clock): controller_silent_s is then how
        # far ahead it lies, not how long ago
        "controller_heartbeat_ahead": _heartbeat_ahead(study),
        # the winner's longer runs after the budget (--validate-steps), reported apart from the screening
        "validation_runs": _validation_runs(pick, study, dispatched),
        # --validate-steps asked for, the study finished, and none ran: why (found by a new-user pass: a study its cap
        # stopped said nothing of the validation it promised)
        "validation_skipped": ("the GPU-hour cap was reached first" if gpu_hour_cap_reached(spent_s, cap)
                               else "none ran") if stored_options.validate_steps > 0 and pick is not None
        and study.status == "finished" and not any(t.origin == TrialOrigin.VALIDATION for t in dispatched) else None,
        "baseline_trial": baseline.number if baseline else None,
        # why the recipe's own layout never ran, when it did not (found by review: the board did not say)
        "baseline_not_run": _baseline_not_run(study) if baseline is None and dispatched else None,
        "baseline_tokens_per_s_per_gpu": baseline_speed,
        "speedup_vs_baseline": _ratio(best_speed, baseline_speed),
    }
    return Board(study, rows, summary, pinned)


def _validation_runs(pick: Any, study: Study, dispatched: list[Trial]) -> list[dict[str, Any]]:
    """One entry per layout that `--validate-steps` ran again, the recommended one first: its validation
    mean beside the screening figure the study chose it by (the validation runs never enter that figure;
    recommend.recommend lets them order the two contenders). A validation run that did not complete (a
    longer run can run out of memory where the short one did not) is an entry with its status and no
    throughput."""
    if pick is None:
        return []
    ended = [t for t in dispatched if t.origin == VALIDATION and t.status not in ("completed", "dispatched")
             and t.config_key not in pick.validation]
    unfinished = [{"trials": [t.number], "config": t.config, "status": t.status,
                   "recommended": t.config_key == pick.best.trial.config_key, "tokens_per_s_per_gpu": None,
                   "measured_steps": None, "screening_tokens_per_s_per_gpu": None,
                   "screening_estimate_tokens_per_s_per_gpu": None} for t in ended]
    warmup = study.options.get("warmup_steps", 0) if isinstance(study.options, dict) else 0
    warmup = warmup if isinstance(warmup, int) and warmup >= 0 else 0
    screening = {r.trial.config_key: r for r in (pick.best, pick.runner_up) if r is not None}
    entries = []
    for key, result in pick.validation.items():
        screened = screening.get(key)
        steps = max(len(t.step_times_s) for t in result.trials) - warmup
        entries.append({
            "trials": [t.number for t in result.trials], "config": result.trial.config, "status": "completed",
            "recommended": key == pick.best.trial.config_key,
            "tokens_per_s_per_gpu": result.mean_tokens_per_s_per_gpu,
            # the measured steps of its (longest) run: the steps it reported less the warm-up left out
            "measured_steps": steps if steps > 0 else None,
            # the screening runs' mean, the figure the summary's best line shows beside it
            "screening_tokens_per_s_per_gpu": screened.mean_tokens_per_s_per_gpu if screened else None,
            # what the screening ranked it by (recommend.recommend): its runs pooled with similar layouts'
            "screening_estimate_tokens_per_s_per_gpu": screened.estimate_tokens_per_s_per_gpu if screened else None,
            # the longer run's peak, and whether it is inside the memory margin (the recommendation judges the
            # layout by its screening runs; the line says it: found by review, export --trial of such a run was silent)
            "peak_mem_gib": result.peak_mem_gib, "headroom_gib": pick.headroom_gib,
            "inside_margin": result.peak_mem_gib is not None and pick.memory_gib is not None
            and result.peak_mem_gib > pick.memory_gib - pick.headroom_gib,
        })
    return sorted(entries + unfinished, key=lambda e: not e["recommended"])


def _baseline_not_run(study: Study) -> str:
    """Why a study never ran the recipe's own layout: it breaks a rule on this cluster, or the cost model
    predicts it does not fit the GPU (the search runs only layouts likely to fit)."""
    from autotune.controller.session import recipe_baseline
    from autotune.cost import estimate
    from autotune.errors import UserError
    from autotune.space import study_space_and_workload, violations

    try:
        space, workload = study_space_and_workload(study)
        layout = recipe_baseline(space)
    except (UserError, ValueError, KeyError, TypeError):  # advisory: a hand-edited study gets no reason
        return ""
    bad = violations(layout, workload)
    if bad:
        return f"{layout.short()}: breaks {bad[0].rule} on {workload.cluster.gpus} GPUs"
    peak, memory = estimate(workload, layout).peak_mem_gib, workload.cluster.gpu.memory_gib
    if peak > memory:
        return f"{layout.short()}: predicted at {peak:.1f} GiB of the GPU's {memory:g}"
    return f"{layout.short()}: not proposed"


def checked_prediction(stored: Any) -> dict[str, Any]:
    """A trial's stored prediction as the read side uses it: its finite positive figures (and its
    breakdown's), nothing else. It is advisory and checked where used (storage/_records.py): a hand-edited
    one (a text, a list, 1e999) is left out, not a crash of the page or command showing it."""
    from autotune._numbers import is_positive_finite

    if not isinstance(stored, dict):
        return {}
    kept: dict[str, Any] = {k: v for k, v in stored.items() if isinstance(k, str) and is_positive_finite(v)}
    if isinstance(stored.get("breakdown"), dict):
        kept["breakdown"] = {str(k): v for k, v in stored["breakdown"].items() if is_positive_finite(v)}
    return kept


def trial_view(repo: Repository, study: Study, trial: Trial) -> dict[str, Any]:
    """What `show` and the dashboard's trial page say about one trial beyond its record: its throughput's
    run-to-run sd (as on the leaderboard), the runs of its layout (screening runs, so a repeat is seen
    beside the others) and their mean, and the measurement against the cost model's prediction made
    before the run, with that prediction's 80% interval (the validation residuals: cost.throughput_interval)."""
    from autotune.cost import memory_interval, throughput_interval

    dispatched = repo.trials(study.id, dispatched_only=True)
    pick = study_recommendation(dispatched, study)
    speed = trial.tokens_per_s_per_gpu if trial.status == "completed" else None
    noise = pick.noise if pick else None
    # grouped as the recommendation groups them: screening runs (the study's and imported ones) together,
    # the longer validation runs apart
    group = pick.layout_of(trial.config_key, validation=trial.origin == VALIDATION) if pick else None
    runs = sorted(group.trials, key=lambda t: t.number) if group else []
    # the layout's runs of the other kind: its validation runs (any ending) beside a screening run, its screening
    # runs beside a validation run (found by review: neither pointed to the other)
    validating = trial.origin == VALIDATION
    others = sorted((t for t in dispatched if (t.origin == VALIDATION) != validating and t.config_key == trial.config_key
                     and t.status != "rejected" and (not validating or (t.status == "completed"
                                                                           and t.tokens_per_s_per_gpu))),
                    key=lambda t: t.number)
    mean = group.mean_tokens_per_s_per_gpu if len(runs) > 1 else None
    predicted = checked_prediction(trial.predicted)
    view: dict[str, Any] = {
        "tokens_per_s_per_gpu_sd": noise.run_sd(speed) if speed and noise else None,
        "layout_runs": [{"trial": t.number, "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
                         # too far from the layout's other runs to be noise: left out of its mean and the noise
                         "straggler": t.number in group.stragglers} for t in runs]
        if len(runs) > 1 else [],
        "layout_mean_tokens_per_s_per_gpu": mean,
        "layout_mean_se": pick.mean_se(group) if mean else None,
        # the layout's longer --validate-steps runs beside a screening run (found by a new-user pass: `show`
        # of the winner's screening run never said it had been validated)
        "layout_validation_runs": [] if validating else [
            {"trial": t.number, "status": t.status, "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu} for t in others],
        "layout_screening_runs": [{"trial": t.number, "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu}
                                  for t in others] if validating else [],
        "predicted": predicted,
        "stopped": _stopped(trial),  # dispatched, but nothing heartbeats it (interrupted, or its controller died)
        # a run of the recommended layout, or of a layout at risk (found by a new-user pass: only export said so)
        "verdict": _with_verdict({"status": trial.status}, trial, pick)["verdict"],
    }
    tokens, peak = predicted.get("tokens_per_s_per_gpu"), predicted.get("peak_mem_gib")
    # an interval overflowing a hand-edited 1.4e308 would be Infinity: no JSON, and no interval
    if tokens and all(map(math.isfinite, interval := throughput_interval(tokens))):
        view["predicted_tokens_per_s_per_gpu_80"] = list(interval)
        view["measured_over_predicted_tokens"] = _ratio(speed, tokens)
    if peak and all(map(math.isfinite, interval := memory_interval(peak))):
        view["predicted_peak_mem_gib_80"] = list(interval)
        view["measured_over_predicted_peak"] = _ratio(trial.peak_mem_gib, peak) if trial.peak_mem_gib else None
    return view


def prediction_text(view: dict[str, Any], source: str = "measured") -> str:
    """`8,860 tokens/s/GPU (80% interval 6,900-11,600) and 75.9 GiB peak (80% interval 70.1-81.3);
    measured/predicted: 1.04x throughput, 0.97x peak memory`: the cost model's prediction made before the
    run (trial_view), '' without one."""
    def shown(value: float, spec: str) -> str:  # a hand-edited 1e308 in 3 digits, not 309
        return format(value, spec) if 1e-3 <= abs(value) < 1e15 else format(value, ".3g")

    predicted = view["predicted"]
    tokens, peak = predicted.get("tokens_per_s_per_gpu"), predicted.get("peak_mem_gib")
    parts = []
    if tokens and "predicted_tokens_per_s_per_gpu_80" in view:
        low, high = view["predicted_tokens_per_s_per_gpu_80"]
        parts.append(f"{shown(tokens, ',.0f')} tokens/s/GPU (80% interval {shown(low, ',.0f')}-{shown(high, ',.0f')})")
    if peak and "predicted_peak_mem_gib_80" in view:
        low, high = view["predicted_peak_mem_gib_80"]
        parts.append(f"{shown(peak, ',.1f')} GiB peak (80% interval {shown(low, ',.1f')}-{shown(high, ',.1f')})")
    ratios = [(f"{r:.2f}x" if r is not None and 1e-3 <= r <= 1e3 else None)
              for r in (view.get("measured_over_predicted_tokens"), view.get("measured_over_predicted_peak"))]
    if not parts:
        return ""
    text = " and ".join(parts)
    shares = [f"{r} {what}" for r, what in zip(ratios, ("throughput", "peak memory")) if r]
    if shares:
        text += f"; {source}/predicted: {', '.join(shares)}"
    # what the interval is (found by a new-user pass: -22%/+32% beside a ratio of 1.00x looked meaningless): the
    # uncalibrated model's spread against published runs, before this study measured anything; a simulated run is
    # drawn from the same model, so its ratio says only the simulated noise and landscape
    text += (" (intervals: the uncalibrated cost model's errors on published Megatron-Bridge runs of models it was "
             "not fitted on")
    return text + ("; a simulated run is drawn from the same model)" if source == "simulated" else ")")


def layout_runs_text(view: dict[str, Any]) -> str:
    """`ran 3 times: trials 4 (8,640), 17 (8,702), 31 (8,674); mean 8,672 ±93 (the ± is its standard error)`, and
    the layout's validation runs beside a screening run; '' for a single run of a layout never validated."""
    text = _screening_runs_text(view["layout_runs"], view)
    validated = view.get("layout_validation_runs") or []
    if validated:
        listed = ", ".join(f"{r['trial']} (" + (f"{r['tokens_per_s_per_gpu']:,.0f}" if r["status"] == "completed" and
                                                r["tokens_per_s_per_gpu"] else
                                                "running" if r["status"] == "dispatched" else
                                                ENDED_OTHERWISE.get(r["status"], str(r["status"]))) + ")"
                           for r in validated)
        text += ("; " if text else "") + (f"validated in longer runs (--validate-steps, reported apart from the "
                                          f"screening runs): trial{'s' if len(validated) > 1 else ''} {listed}")
    screened = view.get("layout_screening_runs") or []
    if screened:
        listed = ", ".join(f"{r['trial']} ({r['tokens_per_s_per_gpu']:,.0f})" for r in screened)
        text += ("; " if text else "") + (f"a longer validation run (--validate-steps) of a layout whose screening "
                                          f"run{'s' if len(screened) > 1 else ''} measured: trial"
                                          f"{'s' if len(screened) > 1 else ''} {listed}")
    return text


def _screening_runs_text(runs: list[dict[str, Any]], view: dict[str, Any]) -> str:
    if not runs:
        return ""
    listed = ", ".join(f"{r['trial']} ({r['tokens_per_s_per_gpu']:,.0f}"
                       + (", a straggler" if r.get("straggler") else "") + ")" for r in runs)
    mean = with_sd(view["layout_mean_tokens_per_s_per_gpu"], view.get("layout_mean_se"))
    return (f"ran {len(runs)} times: trials {listed}; mean {mean}"
            + (" (the ± is its standard error)" if "±" in mean else "")
            + ("; a straggler is too far from the layout's other runs to be run-to-run noise (a slow node, a"
               " throttled GPU): the mean and the study's run noise leave it out (a pair that disagrees is"
               " averaged, as sure as one run)" if any(r.get("straggler") for r in runs) else ""))


def breakdown_text(predicted: dict[str, Any], limit: int = 6) -> str:
    """`compute 24.4 s (81%), ep 3.21 s (11%), ... and 3 smaller`: the largest terms of a predicted step
    (checked_prediction)."""
    step, terms = predicted.get("step_time_s"), predicted.get("breakdown") or {}
    # terms under half a percent of the step are counted, not listed (a 0.0005 s DP term says nothing)
    top = [(k, v) for k, v in sorted(terms.items(), key=lambda kv: -kv[1]) if not step or v >= 0.005 * step][:limit]
    parts = [f"{name} {seconds:,.3g} s" + (f" ({seconds / step:.0%})" if step and seconds / step <= 1 else "")
             for name, seconds in top]
    rest = len(terms) - len(top)
    if not parts:
        return f"{rest} terms, each under half a percent of the step" if rest else ""
    return ", ".join(parts) + (f" and {rest} smaller" if rest > 0 else "")


def estimate_note(summary: dict) -> str:
    """`; estimated N with the runs of layouts sharing its knob values` when the recommendation's pooled
    estimate differs from its measured mean by more than half a percent, else ''."""
    estimate, mean = summary.get("best_estimated_tokens_per_s_per_gpu"), summary.get("best_tokens_per_s_per_gpu")
    if not estimate or not mean or abs(estimate / mean - 1) <= 0.005:
        return ""
    return f"; estimated {estimate:,.0f} with the runs of layouts sharing its knob values"


def benchmark_label(study: Study) -> str:
    """`benchmark-only: ...` when the study's runs used settings that are never part of a tuned result."""
    from autotune.megatron import benchmark_only

    return benchmark_only.label(benchmark_only.of_study(study))


def to_json(board: Board) -> str:
    return json.dumps({"summary": board.summary, "trials": board.rows}, indent=2, default=str)


def to_csv(board: Board) -> str:
    from autotune._tables import terminal_safe

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in board.rows:
        # free text (a launcher's message, a note) with control characters escaped: `leaderboard --format csv`
        # is read on terminals too, where an ESC sequence would act
        writer.writerow([json.dumps(row["config"], sort_keys=True) if c == "config"
                         else terminal_safe(row[c]) if isinstance(row.get(c), str) else row.get(c) for c in COLUMNS])
    return out.getvalue()


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


def with_sd(value: float | None, sd: float | None, spec: str = ",.0f") -> str:
    """`8,860 ±165`: a throughput and its uncertainty (just the value when there is none, or when it
    rounds to nothing at `spec`)."""
    shown = format(sd, spec) if value is not None and sd else ""
    return _fmt(value, spec) + (f" ±{shown}" if shown.strip("0.,") else "")


def best_with_se(summary: dict[str, Any], flag_risk: bool = True) -> str:
    """The recommendation's throughput ± its standard error (`8,860 ±165`), '' before any run completed;
    `8,778 ±263 at risk` when no layout kept the memory headroom (found by review: `status` and `compare` gave an
    at-risk recommendation unmarked), unless the caller says why beside it (`flag_risk` False)."""
    shown = with_sd(summary["best_tokens_per_s_per_gpu"], summary.get("best_tokens_per_s_per_gpu_se"))
    return shown + (" at risk" if flag_risk and shown and summary.get("best_risk") else "")


ENDED_OTHERWISE = {"oom": "ran out of memory", "failed": "failed", "timeout": "timed out", "lost": "was lost",
                   "pruned": "was pruned"}


def validation_note(summary: dict[str, Any]) -> str:
    """`validation (--validate-steps, outside the budget): the recommended layout's validation run (trial 12)
    8,785 over 50 steps (screening 8,760); the runner-up TP2 ...'s validation run (trial 13) 8,543 over 50 steps
    (screening 8,551)`; why none ran when one was asked for (validation_skipped); '' otherwise."""
    entries = summary.get("validation_runs") or []
    if not entries:
        skipped = summary.get("validation_skipped")
        return (f"no validation run (--validate-steps): {skipped}; the recommendation rests on the screening runs "
                "alone") if skipped else ""
    parts = []
    for entry in entries:
        who = "the recommended layout's" if entry["recommended"] else \
            f"the runner-up {LayoutConfig.from_mapping(entry['config']).short()}'s"
        trials = ", ".join(map(str, entry["trials"]))
        steps = f" over {entry['measured_steps']:,} steps" if entry.get("measured_steps") else ""
        runs = "validation run" + ("s" if len(entry["trials"]) > 1 else "")
        screened = entry.get("screening_tokens_per_s_per_gpu")
        if entry.get("tokens_per_s_per_gpu") is None:  # it ended otherwise: say how (an OOM over more steps)
            ended = ENDED_OTHERWISE.get(entry["status"], entry["status"])
            if entry["recommended"]:  # recommended still (a failure, not an OOM): say so
                parts.append(f"{who} {runs} (trial {trials}) {ended}")
            else:  # the screening's winner or its runner-up: recommend.recommend passed it over for the OOM
                layout = LayoutConfig.from_mapping(entry["config"]).short()
                parts.append(f"the {runs} of {layout} (trial {trials}) {ended}"
                             + (", so it is not recommended" if entry["status"] == "oom" else ""))
            continue
        parts.append(f"{who} {runs} (trial {trials}) {_fmt(entry['tokens_per_s_per_gpu'], ',.0f')}{steps}"
                     + (f" (screening {_fmt(screened, ',.0f')})" if screened else "")
                     + (f", peaking at {entry['peak_mem_gib']:.1f} GiB, inside the {entry['headroom_gib']:g} GiB memory "
                        "margin" if entry.get("inside_margin") else ""))
    verdict = ""
    first, second = (entries + [{}])[:2]
    # recommend.recommend orders the two contenders by their validation runs: say when that overturned the
    # screening's order (the recommended layout is then not the one with the best screening figure)
    if first.get("recommended") and second.get("screening_tokens_per_s_per_gpu") and \
            first.get("screening_tokens_per_s_per_gpu"):
        # the screening ranked them by their estimates (the means where an older record has none)
        def ranked(entry: dict[str, Any]) -> float:
            return entry.get("screening_estimate_tokens_per_s_per_gpu") or entry["screening_tokens_per_s_per_gpu"]

        kept = ranked(second) <= ranked(first)
        verdict = "; the validation runs " + ("kept" if kept else "reversed") + " the screening's order"
        # "reversed" alone read as a verdict on a 1 tokens/s gap (found by a new-user pass): say how far apart the
        # screening had them (the runner-up is validated when the pooled estimates are within the noise:
        # recommend.validation_choices; these are the plain means the line quotes)
        gap = abs(second["screening_tokens_per_s_per_gpu"] / first["screening_tokens_per_s_per_gpu"] - 1)
        apart = f"{100 * gap:.1f}%" if gap >= 0.001 else "under 0.1%"
        verdict += f" (the screening figures {apart} apart)"
    return "validation (--validate-steps, outside the budget): " + "; ".join(parts) + verdict


def best_risk_note(summary: dict[str, Any]) -> str:
    """`no layout kept the 3.2 GiB headroom; it ran out of memory in one of its runs` when the recommendation
    is at risk, else ''."""
    if not summary.get("best_risk"):
        return ""
    return f"no layout kept the {summary['memory_headroom_gib']:g} GiB headroom; it {summary['best_risk']}"


def risky_note(summary: dict[str, Any], limit: int = 5) -> str:
    """`trial 3 (ran out of memory in one of its runs), trial 5 (peaked at 78.1 GiB, inside the 3.2 GiB
    memory margin)`: the faster layouts the recommendation passed over, and why."""
    trials, reasons = summary.get("risky_faster_trials") or [], summary.get("risky_faster_reasons") or []
    return ", ".join(f"trial {n} ({why})" for n, why in list(zip(trials, reasons))[:limit]) + \
        (f" and {len(trials) - limit} more" if len(trials) > limit else "")


def runs_note(summary: dict[str, Any]) -> str:
    """`mean of 3 runs, ± its standard error`, `mean of 3 runs` when no error is shown, '' for one run."""
    runs = summary.get("best_runs", 0)
    if runs <= 1:
        return ""
    return f"mean of {runs} runs" + (", ± its standard error" if summary.get("best_tokens_per_s_per_gpu_se") else "")


def noise_note(summary: dict[str, Any]) -> str:
    """What the ± beside a throughput is and where its figure comes from ('' when none is shown)."""
    rel = summary.get("run_noise_rel_sd")
    if not rel:
        return ""
    from autotune._run_noise import NOISE_LOG_STD

    n = summary.get("run_noise_repeated_layouts", 0)
    source = (f"from {n} layout{'s' if n > 1 else ''} run more than once, shrunk toward an assumed "
              f"{100 * NOISE_LOG_STD:.0f}%" if n else "assumed until a layout runs twice")
    stragglers = summary.get("run_noise_stragglers") or []
    if stragglers:
        listed = ", ".join(str(number) for number in stragglers[:8]) + (", ..." if len(stragglers) > 8 else "")
        whose = "their layouts'" if len(stragglers) > 1 else "its layout's"
        source += (f"; without trial{'s' if len(stragglers) > 1 else ''} {listed}, too far from {whose} "
                   "other runs to be noise")
    return f"±: one run-to-run sd ({100 * rel:.1f}%, {source})"


STYLES = {"completed": "green", "oom": "red", "pruned": "yellow", "failed": "magenta", "timeout": "magenta",
          "dispatched": "cyan", "rejected": "dim"}


CREATED_UNSTARTED_S = 60.0  # a study still `created` this long after it was stored: its start died


def controller_silence_s(study: Study) -> float | None:
    """Seconds since the controller of a `running` study last wrote its heartbeat (of a `created` one: since it
    was created), when that is longer than the staleness limit the controllers themselves use (its trials are
    then adoptable); else None."""
    beat = study.controller_heartbeat_at
    if study.status == "created" and beat is None and study.created_at is not None:
        # `start` stores its study only once Ray is up, and runs it at once: one still `created` past the limit
        # is a start that died between the two (found by an adversarial pass: `leaderboard --watch` of it never
        # ended); `resume` runs it
        silent = _stale_s(study.created_at)
        # with a margin: between storing the study and running it, start builds the controller (the legal set at
        # 64 GPUs takes seconds, more on a loaded machine)
        return silent if silent is not None and silent > CREATED_UNSTARTED_S else None
    if study.status != "running" or beat is None:
        return None
    # a heartbeat dated in the future: how far ahead it lies (finite, for strict JSON; the summary flags it)
    ahead = heartbeat_ahead_s(beat)
    return ahead if ahead is not None else _stale_s(beat)


def _heartbeat_ahead(study: Study) -> bool:
    beat = study.controller_heartbeat_at
    return study.status == "running" and beat is not None and heartbeat_ahead_s(beat) is not None


def adopted_by_a_live_controller(study_status: str, controller_silent_s: float | None) -> bool:
    """Whether a stopped run (one nothing heartbeats) is a dead controller's in a study a live controller runs,
    which that controller adopts (runs again) when a slot and the GPU-hour cap have room, rather than one the
    study's interruption cancelled, which `resume` runs again."""
    return study_status == "running" and not controller_silent_s


def stopped_note(summary: dict[str, Any]) -> str:
    """What the board says of its runs that nothing heartbeats (summary["stopped"])."""
    import shlex

    if adopted_by_a_live_controller(summary["status"], summary.get("controller_silent_s")):
        return (f"{summary['stopped']} run(s) whose controller stopped: the study's controller runs them again when "
                "a slot and the GPU-hour cap have room")
    return (f"{summary['stopped']} run(s) stopped by the interruption (`autotune resume "
            f"{shlex.quote(summary['study'])}` runs them again)")


def shown_status(row: dict[str, Any]) -> str:
    """A row's status as readers see it: a dispatched run is `running`, or `stopped` when nothing heartbeats it
    (the study's interruption cancelled it, or its controller died: stopped_note says what runs it again)."""
    if row["status"] != "dispatched":
        return row["status"]
    return "stopped" if row.get("stopped") else "running"


def _cells(row: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    from autotune._tables import cell_text

    status = shown_status(row)
    style = STYLES.get(row["status"])
    speedup = row["speedup_vs_baseline"]
    verdict = row.get("verdict") or ""
    # in the # column, which no width drops: * the recommended layout, ! a layout at risk (the legend says so)
    mark = " *" if verdict.startswith(RECOMMENDED) else (" !" if verdict else "")
    return [f"{row['trial']}{mark}", f"[{style}]{status}[/]" if style else status,
            LayoutConfig.from_mapping(row["config"]).short(),
            with_sd(row["tokens_per_s_per_gpu"], row.get("tokens_per_s_per_gpu_sd")),
            _fmt(row["tflops_per_gpu"], ".0f"), f"{100 * row['mfu']:.1f}%" if row["mfu"] else "",
            _fmt(row["step_time_s"], ".2f"), _fmt(row["peak_mem_gib"], ".1f"),
            f"{speedup:.2f}x" if speedup else "",
            cell_text("; ".join(filter(None, (row["note"] or row["reason"], verdict_text(row, summary)))))]


def rich_table(board: Board, title: str | None = None):
    """The leaderboard for a terminal: the table (fitted to the console's width; the baseline pinned
    under a rule when `top` cut it off) and a legend of the abbreviations it shows."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    from autotune._tables import Col, FittedTable

    # at 80 columns TFLOP/s (MFU says it), then step time, then the note give way; an empty "vs recipe" column (the
    # recipe's layout did not complete: the legend says why) before any of them (found by a new-user pass)
    empty_versus = not any(row["speedup_vs_baseline"] for row in board.rows + board.pinned)
    table = FittedTable([Col("#", "right"), Col("status"), Col("layout", wrap=True, whole=True),
                         Col("tok/s/GPU", "right"), Col("TFLOP/s", "right", optional=3), Col("MFU", "right"),
                         Col("step s", "right", optional=2), Col("mem GiB", "right"),
                         Col("vs recipe", "right", optional=4 if empty_versus else 0),
                         Col("note", wrap=True, optional=1)],
                        # a title is markup: the study's name and the note are text
                        title=escape((title or f"{board.study.name}: leaderboard")
                                     + _source_tag(board.summary)
                                     + (f" [{board.summary['benchmark_only']}]" if board.summary.get("benchmark_only")
                                        else "")))
    for row in board.rows:
        table.add_row(*_cells(row, board.summary))
    if board.pinned:
        table.add_section()
        for row in board.pinned:
            table.add_row(*_cells(row, board.summary), style="dim")
    return Group(table, Text(legend(board), style="dim"))


SOURCE_MEANINGS = {"simulated": "every figure is the cost model's (with the simulate backend's noise), no run",
                   "replayed": "every figure is looked up in the replay table, no run"}


def _source_tag(summary: dict[str, Any]) -> str:
    """The title's word on where a study's figures come from (found by review: a simulated study's table
    looked measured; only its GPU-hours said otherwise)."""
    source = summary.get("metrics_source", "measured")
    return "" if source == "measured" else f" ({source})"


# the tokens of LayoutConfig.short(), in its order
_PARALLEL = (("TP", "tensor"), ("PP", "pipeline"), ("VPP", "virtual pipeline"), ("CP", "context"), ("EP", "expert"),
             ("ETP", "expert tensor"))


def legend(board: Board) -> str:
    """One line naming every abbreviation the board's rows use, and what "vs recipe" compares with."""
    import re

    tokens = {t for row in board.rows + board.pinned for t in LayoutConfig.from_mapping(row["config"]).short().split()}
    prefixes = {re.match(r"[A-Za-z]+", t).group(0) for t in tokens}
    parallel = [(short, long) for short, long in _PARALLEL if short in prefixes]
    parts = []
    if parallel:
        parts.append(f"{'/'.join(s for s, _ in parallel)}: {'/'.join(n for _, n in parallel)} parallel")
    for token, meaning in (("SP", "sequence parallel"), ("MBS", "micro-batch"), ("DO", "distributed optimizer"),
                           ("rc=sel", "selective recompute")):
        if token in prefixes or token in tokens:
            parts.append(f"{token} {meaning}")
    if any(t.startswith("rc=full") for t in tokens):
        parts.append("rc=full/M/N full recompute (method M, N layers)")
    from autotune import config

    # labels of other knobs a layout may carry as `label=value` (config.PERF_LABELS: knob -> label)
    for knob, label in getattr(config, "PERF_LABELS", {}).items():
        if any(t.startswith(f"{label}=") for t in tokens):
            parts.append(f"{label} {knob.replace('_', ' ')}")
    source = board.summary.get("metrics_source", "measured")
    if source in SOURCE_MEANINGS:
        imported = " (the study's own runs; an imported run was measured)" if board.summary.get("imported") else ""
        parts.append(f"{source}: {SOURCE_MEANINGS[source]}{imported}")
    parts.append("MFU: % of dense BF16 peak")
    if any(row.get("tokens_per_s_per_gpu_sd") for row in board.rows + board.pinned):
        parts.append(noise_note(board.summary))
    notes = [n for n in MEANINGS if any(row.get("note") == n for row in board.rows + board.pinned)]
    if notes:
        parts.append("note: " + ", ".join(f"{n} = {MEANINGS[n]}" for n in notes))
    s = board.summary
    if s["baseline_tokens_per_s_per_gpu"]:
        parts.append(f"vs recipe: speed-up over the recipe's own layout (trial {s['baseline_trial']})")
    elif s["baseline_trial"] is not None:
        parts.append(f"vs recipe: empty until the recipe's own layout (trial {s['baseline_trial']}) completes")
    else:
        why = s.get("baseline_not_run", "")
        parts.append("vs recipe: empty, the recipe's own layout was not run" + (f" ({why})" if why else ""))
    # found by a new-user pass: the table's first rows may be layouts the study does not recommend (faster, but
    # inside the memory margin, or out of memory in a run), and only the JSON summary said which it recommends
    if s.get("best_trial") is not None:
        risk = best_risk_note(s)
        parts.append(f"recommended: trial {s['best_trial']}" + (f" ({risk})" if risk else "")
                     + " (# marked *; ! marks a layout at risk)")
    if s.get("risky_faster_trials"):
        parts.append(f"faster but at risk, so not recommended: {risky_note(s)}")
    return "; ".join(parts)


def summary_line(summary: dict[str, Any]) -> str:
    hours = summary["gpu_seconds"] / 3600
    source = summary.get("metrics_source", "measured")
    # a simulated or replayed study spends no GPU time: say so rather than print hours as if spent
    gpu_time = f"GPU-hours {hours:.2f}" if source == "measured" else f"{source} GPU-hours {hours:.2f} (none spent)"
    tag = f" | {summary['benchmark_only']}" if summary.get("benchmark_only") else ""
    outside = [f"{summary[k]} {k}" for k in ("imported", "validation") if summary.get(k)]
    if outside:  # found by review: imported rows on the table, but not in these counts, without a word
        tag += f" | outside the budget: {', '.join(outside)}"
    if summary.get("max_gpu_hours") is not None:
        tag += f" | cap {summary['max_gpu_hours']:,.4g} GPU-hours" + (
            " (reached: no further run starts)" if summary.get("gpu_hour_cap_reached") else "")
    if summary.get("controller_silent_s"):
        tag += f" | {silence_note(summary)}"
    if summary.get("stopped"):
        tag += f" | {stopped_note(summary)}"
    return (f"dispatched {summary['dispatched']}/{summary['budget']} | completed {summary['completed']} | "
            f"OOM {summary['oom']} | pruned {summary['pruned']} | failed {summary['failed']} | "
            # its own count, as on the rows and in JSON (a new-user pass: a timed-out run read "failed 1")
            + (f"timeout {summary['timeout']} | " if summary.get("timeout") else "")
            + f"rejected before dispatch {summary['rejected_before_dispatch']} | {gpu_time}{tag}")


def silence_label(summary: dict[str, Any]) -> str:
    """What a silent study's status adds: its controller went silent, or (`created`) it never started (review:
    a study that never ran read "running, controller silent")."""
    return "not started" if summary["status"] == "created" else "controller silent"


def status_label(summary: dict[str, Any]) -> str:
    """A study's status as the listings show it: with why it is silent, or that its GPU-hour cap stopped it
    (review: `status` read "finished 6/20" with no reason)."""
    if summary.get("controller_silent_s"):
        return f"{summary['status']}, {silence_label(summary)}"
    if summary.get("gpu_hour_cap_reached") and summary["status"] != "running" and \
            summary["dispatched"] < summary["budget"]:  # the cap stopped runs of the budget (not only spent)
        return f"{summary['status']}, GPU-hour cap"
    if summary["status"] == "finished" and summary.get("best_config") is None and summary.get("dispatched"):
        return "finished, no run completed"  # found by a new-user pass: it read as a study still to end
    return summary["status"]


def silence_note(summary: dict[str, Any]) -> str:
    """`controller silent for 12 min (stopped?): autotune resume NAME continues the study`, or for a study a
    start stored and never ran, `not started 5 min after it was created (its start stopped?): ... runs it`."""
    import shlex

    from autotune._tables import duration

    silent = summary["controller_silent_s"]
    took = duration(silent)
    resume = f"`autotune resume {shlex.quote(summary['study'])}`"
    if summary["status"] == "created":
        return f"not started {took} after it was created (its start stopped?): {resume} runs it"
    if summary.get("controller_heartbeat_ahead"):
        return (f"controller heartbeat dated {took} ahead of this clock (no live controller wrote it, or a clock "
                f"is wrong): {resume} continues it once no controller runs it")
    return f"controller silent for {took} (stopped?): {resume} continues the study"
