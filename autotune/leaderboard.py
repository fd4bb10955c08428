"""Leaderboards and study summaries, built from the SQL store only (never Optuna or Ray).

Completed trials rank by tokens/s/GPU; then the other dispatched trials by number. The recipe's own
layout (the baseline, when it was measured) gives every row a speed-up.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from autotune.config import LayoutConfig
from autotune.controller.recommend import study_recommendation
from autotune.storage import Repository, Study, Trial

COLUMNS = ("trial", "status", "reason", "config", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
           "peak_mem_gib", "gpu_seconds", "speedup_vs_baseline", "note")


@dataclass
class Board:
    study: Study
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def _row(trial: Trial, baseline_speed: float | None) -> dict[str, Any]:
    speed = trial.tokens_per_s_per_gpu if trial.status == "completed" else None
    return {
        "trial": trial.number, "status": trial.status, "reason": trial.reason, "config": trial.config,
        "step_time_s": trial.step_time_s if speed else None, "tokens_per_s_per_gpu": speed,
        "tflops_per_gpu": trial.tflops_per_gpu if speed else None, "mfu": trial.mfu if speed else None,
        "peak_mem_gib": trial.peak_mem_gib, "gpu_seconds": trial.gpu_seconds,
        "speedup_vs_baseline": speed / baseline_speed if speed and baseline_speed else None,
        "note": trial.strategy_note or (trial.origin if trial.origin != "study" else None), "message": trial.message, "implied_by_trial": trial.implied_by_trial,
    }


def build(repo: Repository, study: Study, include_rejected: bool = False, top: int | None = None) -> Board:
    trials = repo.trials(study.id)
    dispatched = [t for t in trials if t.dispatched]
    baseline = next((t for t in dispatched if t.strategy_note == "baseline"), None)
    baseline_speed = baseline.tokens_per_s_per_gpu if baseline and baseline.status == "completed" else None
    completed = sorted((t for t in dispatched if t.status == "completed" and t.tokens_per_s_per_gpu),
                       key=lambda t: -t.tokens_per_s_per_gpu)
    others = [t for t in dispatched if t not in completed]
    shown = completed + others + ([t for t in trials if not t.dispatched] if include_rejected else [])
    rows = [_row(t, baseline_speed) for t in shown]
    if top is not None:
        rows = rows[:top]
    counts = repo.counts(study.id)
    # the study's answer: the best mean over runs that keeps the memory headroom, not the luckiest run
    pick = study_recommendation(dispatched, study)
    best = pick.trial if pick else None
    best_speed = pick.best.mean_tokens_per_s_per_gpu if pick else None
    summary = {
        "study": study.name, "model": study.model, "status": study.status, "budget": study.budget,
        "sampler": study.sampler, "backend": study.backend, "workload": study.workload,
        "dispatched": counts["dispatched"], "rejected_before_dispatch": counts["rejected"],
        "running": counts["running"], "completed": counts["completed"], "oom": counts["oom"],
        "pruned": counts["pruned"], "failed": counts["failed"], "timeout": counts["timeout"], "lost": counts["lost"],
        "gpu_seconds": sum(t.gpu_seconds for t in dispatched),
        "best_trial": best.number if best else None,
        "best_config": best.config if best else None,
        "best_tokens_per_s_per_gpu": best_speed,
        "best_runs": pick.best.runs if pick else 0,
        "best_peak_mem_gib": pick.best.peak_mem_gib if pick else None,
        "memory_headroom_gib": pick.headroom_gib if pick else None,
        # faster layouts that ran inside the memory margin: measured, but not recommended
        "risky_faster_trials": [r.trial.number for r in pick.risky] if pick else [],
        "baseline_trial": baseline.number if baseline else None,
        "baseline_tokens_per_s_per_gpu": baseline_speed,
        "speedup_vs_baseline": (best_speed / baseline_speed) if best_speed and baseline_speed else None,
    }
    return Board(study, rows, summary)


def to_json(board: Board) -> str:
    return json.dumps({"summary": board.summary, "trials": board.rows}, indent=2, default=str)


def to_csv(board: Board) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in board.rows:
        writer.writerow([json.dumps(row["config"], sort_keys=True) if c == "config" else row.get(c) for c in COLUMNS])
    return out.getvalue()


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


def rich_table(board: Board, title: str | None = None):
    from rich.table import Table

    table = Table(title=title or f"{board.study.name}: leaderboard", expand=False)
    for column, justify in (("#", "right"), ("status", "left"), ("layout", "left"), ("tok/s/GPU", "right"),
                            ("TFLOP/s", "right"), ("MFU", "right"), ("step s", "right"), ("mem GiB", "right"),
                            ("vs recipe", "right"), ("note", "left")):
        table.add_column(column, justify=justify, no_wrap=column in ("layout", "status"))
    styles = {"completed": "green", "oom": "red", "pruned": "yellow", "failed": "magenta", "timeout": "magenta",
              "dispatched": "cyan", "rejected": "dim"}
    for row in board.rows:
        status = row["status"] if row["status"] != "dispatched" else "running"
        speedup = row["speedup_vs_baseline"]
        table.add_row(str(row["trial"]), f"[{styles.get(row['status'], '')}]{status}[/]",
                      LayoutConfig.from_mapping(row["config"]).short(), _fmt(row["tokens_per_s_per_gpu"], ",.0f"),
                      _fmt(row["tflops_per_gpu"], ".0f"), _fmt(row["mfu"] and 100 * row["mfu"], ".1f"),
                      _fmt(row["step_time_s"], ".2f"), _fmt(row["peak_mem_gib"], ".1f"),
                      f"{speedup:.2f}x" if speedup else "", row["note"] or row["reason"] or "")
    return table


def summary_line(summary: dict[str, Any]) -> str:
    return (f"dispatched {summary['dispatched']}/{summary['budget']} | completed {summary['completed']} | "
            f"OOM {summary['oom']} | pruned {summary['pruned']} | failed {summary['failed'] + summary['timeout']} | "
            f"rejected before dispatch {summary['rejected_before_dispatch']} | "
            f"GPU-hours {summary['gpu_seconds'] / 3600:.2f}")
