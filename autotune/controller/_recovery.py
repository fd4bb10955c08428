"""Recovery: what a dead controller left behind, and only that.

Trials it was running (stale heartbeat) are adopted by compare-and-set (`adoptable`); Optuna proposals
it left RUNNING are settled (`reconcile`).

Several controllers may share a study (PostgreSQL). A controller records each proposal it asked
Optuna for (a dispatch, or a rejection after a lost race) within moments of asking, and tells
Optuna a trial's outcome within moments of recording it. So an Optuna trial still RUNNING is
abandoned only when that moment is long past: the proposal is older than `stale_s` and unrecorded,
or its autotune trial ended more than `stale_s` ago. A younger one may belong to a live controller
that is about to record or tell it; failing it would contradict that controller (issue: a joiner
failed a trial its owner had completed), so it is left for a later pass.
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


def abandoned(open_trials: list, recorded: dict[int, Any], stale_s: float) -> list[tuple[int, Any]]:
    """(Optuna number, autotune trial or None) of the RUNNING / WAITING Optuna trials `open_trials`
    whose owner stopped."""
    found = []
    local_now = dt.datetime.now()  # Optuna stamps datetime_start with the local naive time
    for trial in open_trials:
        mine = recorded.get(trial.number)
        if mine is None:
            if _age_s(trial.datetime_start, local_now) > stale_s:
                found.append((trial.number, None))
        elif mine.status == "rejected" or mine.finished:
            if mine.finished_at is None or (utcnow() - mine.finished_at).total_seconds() > stale_s:
                found.append((trial.number, mine))
    return found


def others_ended_lately(trials: list, controller_id: str, within_s: float) -> bool:
    """Whether a run of another controller ended within the last `within_s`: that controller may be alive and
    proposing its next run, with nothing in flight for the moment (review: a controller that had used up the space
    left in such a gap, writing `finished` onto a study another controller still ran, and nobody was left to adopt
    that one's runs had it died)."""
    now = utcnow()
    for trial in trials:
        if trial.controller_id in (None, controller_id) or trial.finished_at is None:
            continue
        ended = trial.finished_at
        if ended.tzinfo is not None:
            ended = ended.astimezone(dt.timezone.utc).replace(tzinfo=None)
        if 0 <= (now - ended).total_seconds() < within_s:
            return True
    return False


def reconcile(repo, study_id: int, optuna, stale_s: float, tell_trial) -> None:
    """Settle the Optuna trials a dead controller left RUNNING: an unrecorded proposal is failed;
    one whose autotune trial was recorded gets that trial's outcome through `tell_trial(number, trial)`."""
    open_trials = optuna.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    local_now = dt.datetime.now()
    if not any(_age_s(t.datetime_start, local_now) > stale_s for t in open_trials):
        return  # only a proposal older than stale_s can be abandoned: no need to read every row of the record
    recorded = {t.optuna_trial_number: t for t in repo.trials(study_id) if t.optuna_trial_number is not None}
    for number, trial in abandoned(open_trials, recorded, stale_s):
        if trial is None:
            optuna.tell_fail(number, {"status": "not_dispatched", "reason": "controller_stopped",
                                      "message": "the controller stopped before recording this proposal"})
        else:
            tell_trial(number, trial)


def adoptable(repo, study_id: int, controller_id: str, stale_s: float, free_slots, outcome_of, rerun_cap):
    """Trials whose controller stopped heartbeating, each adopted (compare-and-set: two adopters cannot both win)
    before it is yielded with the outcome its run left (`outcome_of(trial)`, read first: None when it must run
    again) and the adoption (storage.Adoption: ADOPTED, or CAP for one that must run again and that the GPU-hour
    cap has no room for). A trial to run again is adopted only into room under the cap (`rerun_cap(trial)`: the
    GpuHourCap or None, and the GPU-seconds its dead attempt held), checked with the adoption under the study
    row's lock; one the runs in flight leave no room for is left stale for a later pass. Stops while
    `free_slots()` is 0."""
    from autotune.storage import Adoption

    cutoff = utcnow() - dt.timedelta(seconds=stale_s)
    for trial in repo.stale_trials(study_id, stale_s, controller_id):
        if free_slots() == 0:
            return
        outcome = outcome_of(trial)
        cap, held = rerun_cap(trial) if outcome is None else (None, 0.0)
        adoption = repo.adopt_trial(study_id, trial.number, controller_id, cutoff, cap=cap, held_gpu_seconds=held)
        if adoption in (Adoption.ADOPTED, Adoption.CAP):
            yield trial, outcome, adoption
