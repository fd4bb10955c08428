"""Which Optuna proposals a dead controller left behind (and only those).

Several controllers may share a study (PostgreSQL). A controller records each proposal (dispatch
or rejection) within moments of asking Optuna for it, and tells Optuna a trial's outcome within
moments of recording it. So an Optuna trial still RUNNING is abandoned only when that moment is
long past: the proposal is older than `stale_s` and unrecorded, or its autotune trial ended more
than `stale_s` ago. A younger one may belong to a live controller that is about to record or tell
it; failing it would contradict that controller (issue: a joiner failed a trial its owner had
completed), so it is left for a later pass.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from optuna.trial import TrialState

from autotune.storage.models import utcnow


def _age_s(started: dt.datetime | None, now: dt.datetime) -> float:
    if started is None:
        return float("inf")
    if started.tzinfo is not None:
        now = now.astimezone()
    return (now - started).total_seconds()


def abandoned(optuna_study, recorded: dict[int, Any], stale_s: float) -> list[tuple[int, Any]]:
    """(Optuna number, autotune trial or None) of RUNNING Optuna trials whose owner stopped."""
    found = []
    local_now = dt.datetime.now()  # Optuna stamps datetime_start with the local naive time
    for trial in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        mine = recorded.get(trial.number)
        if mine is None:
            if _age_s(trial.datetime_start, local_now) > stale_s:
                found.append((trial.number, None))
        elif mine.status == "rejected" or mine.finished:
            if mine.finished_at is None or (utcnow() - mine.finished_at).total_seconds() > stale_s:
                found.append((trial.number, mine))
    return found
