"""The repository: the only API to autotune's tables. Returns plain records, never live ORM rows.

Every write is its own short transaction, committed before the caller acts on it (a trial is
recorded as dispatched before it is submitted; an outcome is committed before Optuna is told).
Trial numbers and "dispatched at most once" are enforced by unique constraints, so concurrent
controllers on one PostgreSQL study cannot collide: the loser of a race gets None / a retry.
A run's number is the one its caller passes (the controller passes the Optuna trial number), or the
next free one; rejected layouts of an OPTUNA-numbered study are numbered from REJECTED_BASE up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from autotune._numbers import is_finite_number, is_positive_finite
from autotune.errors import StorageError, StudyError
from autotune.storage._engine import make_engine, shown_url
from autotune.storage._records import TRIAL_RULES, check_study_values, check_trial_values
from autotune.storage.migrations import current_revision, ensure_schema, stamped_revision
from autotune.storage.models import (REJECTED_BASE, SCHEMA_REVISION, TERMINAL_STATUSES, Adoption, ClaimRefused, StudyRow,
                                     StudyStatus, TrialNumbering, TrialOrigin, TrialRecordStatus, TrialRow, utcnow)

T = TypeVar("T")
NUMBER_RETRIES = 50  # concurrent controllers racing for the next trial number; each loss costs one query

# Imported runs were not dispatched by autotune, and validation runs of the winner (`--validate-steps`)
# come after the study: only the study's own trials count against the budget.
IN_BUDGET = TrialRow.origin == TrialOrigin.STUDY.value
METRIC_FIELDS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib")


@dataclass(frozen=True)
class Study:
    id: int
    name: str
    model: str
    workload: dict[str, Any]
    space: dict[str, Any]
    budget: int
    sampler: str
    backend: str
    backend_options: dict[str, Any]
    options: dict[str, Any]
    optuna_study_name: str
    status: str
    created_at: dt.datetime
    updated_at: dt.datetime
    controller_heartbeat_at: dt.datetime | None = None
    controller_id: str | None = None
    numbering: str = TrialNumbering.OPTUNA.value  # how its trials are numbered (models.TrialNumbering)
    # {"key": digest of the runs, "estimates": {config_key: tokens/s/GPU}}: recommend.pooled's cache
    pooled_cache: dict[str, Any] | None = None


@dataclass(frozen=True)
class Trial:
    study_id: int
    number: int
    optuna_trial_number: int | None
    config: dict[str, Any]
    config_key: str
    dispatched: bool
    status: str
    reason: str | None = None
    message: str | None = None
    implied_by_trial: int | None = None
    strategy_note: str | None = None
    origin: str = TrialOrigin.STUDY.value
    worker_losses: int = 0
    attempt: int = 0
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0
    artifacts: dict[str, Any] = field(default_factory=dict)
    predicted: dict[str, Any] | None = None
    controller_id: str | None = None
    # the step's parts a trace measured, seconds per step (None: no trace; _numbers.measured_terms)
    measured_terms_s: dict[str, float] | None = None
    created_at: dt.datetime | None = None
    dispatched_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("created_at", "dispatched_at", "finished_at", "heartbeat_at"):
            data[key] = data[key].isoformat() if data[key] else None
        return data


# GPU time one attempt may add (1e10 GPU-seconds: 100,000 GPUs for a day): the read side refuses a row whose
# total is not finite, so a sum that could overflow must never be written
MAX_GPU_SECONDS_PER_ATTEMPT = 1e10


def _gpu_time(gpu_seconds: float) -> float:
    """An attempt's GPU time as the store keeps it; the controller bounds it (the watchdog), so anything
    else is a programming error, refused before it makes the study unreadable."""
    if not is_finite_number(gpu_seconds) or not 0 <= gpu_seconds <= MAX_GPU_SECONDS_PER_ATTEMPT:
        raise ValueError(f"gpu_seconds must be within 0..{MAX_GPU_SECONDS_PER_ATTEMPT:g}, got {gpu_seconds!r}")
    return float(gpu_seconds)


def _next_number(session: Session, study_id: int, rejected: bool = False) -> int:
    """The next free trial number (callers insert it and retry on a clash): above the highest run number
    (1 for none), or for a rejected layout of an OPTUNA-numbered study, from REJECTED_BASE up."""
    numbering = session.scalar(select(StudyRow.numbering).where(StudyRow.id == study_id)) if rejected else None
    above = numbering == TrialNumbering.OPTUNA
    where = TrialRow.number >= REJECTED_BASE if above else TrialRow.number < REJECTED_BASE
    last = session.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id, where))
    return (last if last is not None else (REJECTED_BASE - 1 if above else 0)) + 1


def _study(row: StudyRow) -> Study:
    values = {f.name: getattr(row, f.name) for f in dataclasses.fields(Study)}
    # a cache, not a record: one autotune cannot read is no cache (recommend.pooled then pools afresh),
    # never a reason to refuse the study (and with it every listing of the store)
    if not isinstance(values["pooled_cache"], dict):
        values["pooled_cache"] = None
    return Study(**check_study_values(values))


def _trial(row: TrialRow) -> Trial:
    from autotune._numbers import measured_terms

    values = check_trial_values({f.name: getattr(row, f.name) for f in dataclasses.fields(Trial)})
    # advisory, like `predicted`: one that autotune would not write (a hand edit) is no measurement
    values["measured_terms_s"] = measured_terms(values.get("measured_terms_s"), values.get("step_time_s"))
    return Trial(**values)



def stored_step_times(step_times_s) -> list[float]:
    """The step times a trial keeps: the plausible ones (finite, > 0), as floats; what its read side
    (_records) accepts, and what an import compares a log's times with."""
    return [float(t) for t in step_times_s if is_positive_finite(t)]

# A heartbeat this far ahead of this machine's clock was written by no live controller (clocks of a cluster's
# machines differ by seconds): stale, like a stopped one (found by an adversarial pass: a hand-edited heartbeat in
# 9999 made `resume` wait for that trial for ever)
FUTURE_HEARTBEAT_S = 3600.0


def heartbeat_ahead_s(beat: dt.datetime) -> float | None:
    """Seconds a heartbeat (naive UTC, or aware from a server) lies ahead of this machine's clock when that is
    more than FUTURE_HEARTBEAT_S (no live controller wrote it), else None: the Python side of _heartbeat_stale's
    future test, for set_study_limits and the readers' silence (review: both took a heartbeat in 9999 for a
    live controller, so `resume --budget` refused for ever and the board never said the study was silent)."""
    if beat.tzinfo is not None:
        beat = beat.astimezone(dt.timezone.utc).replace(tzinfo=None)
    ahead = (beat - utcnow()).total_seconds()
    return ahead if ahead > FUTURE_HEARTBEAT_S else None


def _heartbeat_stale(before: dt.datetime):
    """The SQL condition of a trial whose controller is not heartbeating: none, older than `before`, or from the
    future (FUTURE_HEARTBEAT_S); stale_trials and adopt_trial judge alike."""
    future = utcnow() + dt.timedelta(seconds=FUTURE_HEARTBEAT_S)
    return (TrialRow.heartbeat_at.is_(None)) | (TrialRow.heartbeat_at < before) | (TrialRow.heartbeat_at > future)


KEEP = object()  # set_study_limits: leave the GPU-hour cap as stored
MAX_VALIDATION_RUNS = 2  # of a round: the winner, and the runner-up when within the noise (controller/recommend.py)


def gpu_hour_cap_reached(spent_gpu_seconds: float, cap_gpu_hours: float | None) -> bool:
    """Whether a study's runs have held its --max-gpu-hours (no cap: never): the one test of the cap that the
    controller (with its runs in flight), resume, the leaderboard and set_study_limits apply."""
    return cap_gpu_hours is not None and spent_gpu_seconds >= cap_gpu_hours * 3600


def _spent_gpu_seconds(study_id: int):
    """The SQL sum of GPU-seconds the study's own runs held (budget and validation runs; an imported log's run
    is no spending of the study): what its --max-gpu-hours caps."""
    return select(func.coalesce(func.sum(TrialRow.gpu_seconds), 0.0)).where(
        TrialRow.study_id == study_id, TrialRow.dispatched.is_(True), TrialRow.origin != TrialOrigin.IMPORTED.value)


@dataclass(frozen=True)
class GpuHourCap:
    """What a run's start is checked against when a study has a --max-gpu-hours: the cap, the GPU-seconds a run
    in flight counts for before any of the study's runs has ended (the cost forecast's run), and the moment
    before which a run's heartbeat says its controller is gone (a stopped run holds no GPUs). After a run has
    ended, a run in flight counts at the mean GPU-seconds of the runs that ended."""
    max_gpu_hours: float
    first_run_gpu_seconds: float
    live_after: dt.datetime


def _checked_spent(s: Session, study_id: int) -> float:
    """_spent_gpu_seconds, refused when the sum is no plausible number (the readers refuse such a row; the
    raw sum must too: review)."""
    spent = float(s.scalar(_spent_gpu_seconds(study_id)) or 0.0)
    if not (math.isfinite(spent) and spent >= 0):
        name = s.scalar(select(StudyRow.name).where(StudyRow.id == study_id))
        raise StorageError(f"the GPU-seconds of study {str(name)[:80]!r}'s runs sum to {spent!r}: a trial's "
                           "gpu_seconds is no plausible number (was the store edited by hand?)")
    return spent


def _cap_state(s: Session, study_id: int, cap: GpuHourCap, held_gpu_seconds: float = 0.0,
               starting: int | None = None) -> tuple[bool, int]:
    """Whether the study's runs, each in flight under a live controller counted as a whole run (GpuHourCap), reach
    its cap, and how many runs are in flight: the one reading of the cap by the controller's check, by
    claim_dispatch's and by adopt_trial's, under the study row's lock. `held_gpu_seconds`: time an attempt held
    that its row does not count yet; `starting`: the trial about to start again, not counted in flight (a new
    claim is not in the table yet either)."""
    spent = _checked_spent(s, study_id) + held_gpu_seconds
    in_flight = [TrialRow.study_id == study_id, TrialRow.status == TrialRecordStatus.DISPATCHED.value,
                 ~_heartbeat_stale(cap.live_after)]
    if starting is not None:
        in_flight.append(TrialRow.number != starting)
    live = int(s.scalar(select(func.count()).select_from(TrialRow).where(*in_flight)) or 0)
    if live == 0:
        return gpu_hour_cap_reached(spent, cap.max_gpu_hours), 0
    ended_mean = s.scalar(select(func.avg(TrialRow.gpu_seconds)).where(
        TrialRow.study_id == study_id, TrialRow.dispatched.is_(True), TrialRow.origin != TrialOrigin.IMPORTED.value,
        TrialRow.status != TrialRecordStatus.DISPATCHED.value, TrialRow.gpu_seconds > 0))
    per_run = float(ended_mean) if ended_mean is not None else cap.first_run_gpu_seconds
    return gpu_hour_cap_reached(spent + per_run * live, cap.max_gpu_hours), live


def budget_below_dispatched(study: str, budget: int, dispatched: int) -> StudyError:
    """The refusal of a budget below the runs a study has dispatched (`resume --budget`)."""
    return StudyError(f"--budget {budget}: study {study!r} has dispatched {dispatched} runs already")


class Repository:
    """autotune's tables in one database (SQLite file or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str, create: bool = True) -> "Repository":
        """Connect, check the schema (creating it in an empty database) and return the repository.

        `create=False` is for commands that only read: a database without autotune's schema (or a
        SQLite file that does not exist) is a StorageError, and nothing is created.
        """
        engine = make_engine(url, create=create)
        where = shown_url(engine.url)
        try:
            # one plain-SQL read decides the usual case: Alembic is imported only for a store at another revision
            stamped = stamped_revision(engine)
            if stamped != SCHEMA_REVISION:
                if not create and stamped is None and current_revision(engine) is None:
                    raise StorageError(f"no autotune store at {where} (nothing to read; `autotune start` creates one)")
                ensure_schema(engine)
        except SQLAlchemyError as exc:  # a corrupt file, a disk I/O error, a read-only file
            engine.dispose()
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200]
            raise StorageError(f"cannot use the store {where}: {first}") from None
        except StorageError:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """One committed transaction. A unique-key clash (IntegrityError) reaches the caller, which
        treats it as a lost race; any other database error becomes a one-line StorageError, and so does
        a stored row that `_read()` or `_records` refuses (it names the store)."""
        where = shown_url(self.engine.url)
        try:
            with self._sessions.begin() as session:
                yield session
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [exc.__class__.__name__])[0]
            raise StorageError(f"the store {where} failed: {first[:200]}") from None
        except StorageError as exc:  # a row that breaks _records' rules or does not decode: say which store
            raise StorageError(f"the store {where}: {exc}") from None

    @contextlib.contextmanager
    def _read(self) -> Iterator[Session]:
        """A session for fetching stored rows and turning them into records. A value the column type
        cannot decode, in a hand-edited SQLite file (text that is no JSON in a JSON column, no date in a
        DateTime column), makes SQLAlchemy raise ValueError or TypeError while it loads the row: a
        StorageError here, and only here (elsewhere those are bugs and keep their traceback)."""
        with self.session() as session:
            try:
                yield session
            except (ValueError, TypeError) as exc:
                first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
                raise StorageError(f"a stored value cannot be read ({first[:120]}): was the database edited "
                                   f"by hand?") from None

    def _numbered(self, study_id: int, write: Callable[[Session], T]) -> T:
        """Run `write(session)` (which numbers its rows with `_next_number`) in a transaction, again when a
        concurrent controller took the same number (the unique key on (study, number) refuses the second insert)."""
        for _ in range(NUMBER_RETRIES):
            try:
                with self.session() as s:
                    return write(s)
            except IntegrityError:
                continue  # lost the race for this number: take the next one
        raise StorageError(f"could not allocate a trial number after {NUMBER_RETRIES} attempts")

    def close(self) -> None:
        self.engine.dispose()

    # --- studies -------------------------------------------------------------------------------

    def create_study(self, **values: Any) -> Study:
        try:
            with self.session() as s:
                row = StudyRow(**values)
                s.add(row)
                s.flush()
                return _study(row)
        except IntegrityError:
            raise StudyError(f"study {values['name']!r} already exists: continue it with "
                             f"`autotune resume {values['name']}` or choose another --study") from None

    def get_study(self, name: str) -> Study:
        with self._read() as s:
            row = s.scalar(select(StudyRow).where(StudyRow.name == name))
            if row is None:
                # which store was read: a study made with --storage is not in the default one (new-user pass)
                where = shown_url(self.engine.url)
                raise StudyError(f"no study named {name!r} in {where} (see `autotune status`; another store: --storage)")
            return _study(row)

    def find_study(self, name: str) -> Study | None:
        with self._read() as s:
            row = s.scalar(select(StudyRow).where(StudyRow.name == name))
            return _study(row) if row else None

    def list_studies(self) -> list[Study]:
        with self._read() as s:
            return [_study(r) for r in s.scalars(select(StudyRow).order_by(StudyRow.created_at))]

    def list_studies_readable(self) -> tuple[list[Study], list[tuple[str, str]]]:
        """(the studies, in order of creation, whose rows autotune can read; (name, why) of the others): a listing
        that one hand-edited row does not hide (found by an adversarial pass: `status` then listed nothing)."""
        readable, unreadable = [], []
        with self._read() as s:  # the names alone first: a cell that is no JSON fails the whole row's load
            names = list(s.scalars(select(StudyRow.name).order_by(StudyRow.created_at)))
        for name in names:
            try:
                readable.append(self.get_study(name))
            except StorageError as exc:
                unreadable.append((str(name), str(exc)))
        return readable, unreadable

    def set_study_status(self, study_id: int, status: StudyStatus | str) -> None:
        status = StudyStatus(status)  # a misspelt status is a bug here, not a new state in the table
        with self.session() as s:
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(status=status.value,
                                                                             updated_at=utcnow()))

    def set_study_limits(self, study_id: int, budget: int, live_after: dt.datetime,
                         max_gpu_hours: Any = KEEP) -> None:
        """A new budget (`resume --budget`), and a new GPU-hour cap (`resume --max-gpu-hours`; a number, None for
        none, or KEEP to leave it), decided under the lock of the study row that claim_dispatch takes: a
        StudyError when the study has dispatched more runs than `budget`, or when a controller heartbeat newer
        than `live_after` says another controller runs it (its own limits would then disagree with the stored
        ones: review). A `finished` study given runs to make (budget runs, or the validation runs its cap
        stopped) and GPU-hours to make them in becomes `interrupted` in the same transaction, so a resume that
        stops before its first run leaves it resumable."""
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ValueError(f"a budget is a count of at least 1, got {budget!r}")  # a bug of the caller
        with self.session() as s:
            row = s.execute(select(StudyRow.name, StudyRow.status, StudyRow.controller_heartbeat_at, StudyRow.options)
                            .where(StudyRow.id == study_id).with_for_update()).one()
            dispatched = s.scalar(select(func.count()).select_from(TrialRow).where(
                TrialRow.study_id == study_id, TrialRow.dispatched.is_(True), IN_BUDGET))
            if budget < dispatched:
                raise budget_below_dispatched(row.name, budget, dispatched)
            beat = row.controller_heartbeat_at
            if beat is not None and beat.tzinfo is not None:  # stored naive UTC; a server may hand it back aware
                beat = beat.astimezone(dt.timezone.utc).replace(tzinfo=None)
            live = beat is not None and live_after < beat and heartbeat_ahead_s(beat) is None
            if row.status == StudyStatus.RUNNING.value and live:
                raise StudyError(f"study {row.name!r} is running under another controller (its heartbeat is fresh): "
                                 "change its budget or GPU-hour cap once that one has stopped")
            values: dict[str, Any] = {"budget": budget, "updated_at": utcnow()}
            options = dict(row.options or {})
            if max_gpu_hours is not KEEP:
                options["max_gpu_hours"] = max_gpu_hours
                values["options"] = options
            spent = s.scalar(_spent_gpu_seconds(study_id)) or 0.0
            # validation runs the cap may have kept (at most two a round; a resume with nothing left ends at once)
            owed = (options.get("validate_steps") or 0) > 0 and (s.scalar(select(func.count()).select_from(
                TrialRow).where(TrialRow.study_id == study_id, TrialRow.origin == TrialOrigin.VALIDATION.value))
                or 0) < MAX_VALIDATION_RUNS
            runs_to_make = dispatched < budget or owed
            if row.status == StudyStatus.FINISHED.value and runs_to_make and not gpu_hour_cap_reached(
                    spent, options.get("max_gpu_hours")):
                values["status"] = StudyStatus.INTERRUPTED.value
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(**values))

    def set_pooled_cache(self, study_id: int, cache: dict[str, Any]) -> None:
        """Store the pooled estimates of the study's last recommendation (recommend.pooled_cache_entry).
        `updated_at` stays: a cache is no change of the study."""
        with self.session() as s:
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(pooled_cache=cache,
                                                                             updated_at=StudyRow.updated_at))

    def controller_heartbeat(self, study_id: int, controller_id: str) -> None:
        with self.session() as s:
            s.execute(update(StudyRow).where(StudyRow.id == study_id).values(
                controller_heartbeat_at=utcnow(), controller_id=controller_id))

    # --- trials --------------------------------------------------------------------------------

    def _insert_trial(self, study_id: int, number: int | None = None, **values: Any) -> Trial:
        """Insert with `number`, or the next free number (retrying when a concurrent controller took it)."""
        def write(s: Session) -> Trial:
            rejected = values.get("status") == TrialRecordStatus.REJECTED
            row = TrialRow(study_id=study_id, number=_next_number(s, study_id, rejected) if number is None else number,
                           **values)
            s.add(row)
            s.flush()
            return _trial(row)

        return self._numbered(study_id, write)

    def is_dispatched(self, study_id: int, config_key: str) -> bool:
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(TrialRow).where(
                TrialRow.study_id == study_id, TrialRow.dispatch_key == config_key)) > 0

    def add_rejected_many(self, study_id: int, rows: list[dict[str, Any]]) -> None:
        """Record several rejected layouts in one transaction (strategy skips, e.g. the OOM frontier)."""
        if not rows:
            return

        def write(s: Session) -> None:
            first = _next_number(s, study_id, rejected=True)
            for offset, values in enumerate(rows):
                s.add(TrialRow(study_id=study_id, number=first + offset, dispatched=False,
                               status=TrialRecordStatus.REJECTED.value, finished_at=utcnow(), **values))

        self._numbered(study_id, write)

    def add_rejected(self, study_id: int, config: dict, config_key: str, reason: str, message: str,
                     optuna_trial_number: int | None = None, implied_by_trial: int | None = None,
                     predicted: dict | None = None, strategy_note: str | None = None) -> Trial:
        trial = self._insert_trial(study_id, config=config, config_key=config_key, dispatched=False,
                                   status=TrialRecordStatus.REJECTED.value, reason=reason, message=message,
                                   optuna_trial_number=optuna_trial_number, implied_by_trial=implied_by_trial,
                                   predicted=predicted, strategy_note=strategy_note, finished_at=utcnow())
        return trial

    def claim_dispatch(self, study_id: int, config: dict, config_key: str, optuna_trial_number: int | None,
                       controller_id: str, budget: int, predicted: dict | None = None,
                       strategy_note: str | None = None, dispatch_key: str | None = None,
                       origin: TrialOrigin = TrialOrigin.STUDY, number: int | None = None,
                       cap: GpuHourCap | None = None) -> Trial | ClaimRefused:
        """Record a trial as dispatched (numbered `number`, or the next free number), committed before
        anything runs it.

        Returns the trial, or why it was not recorded: ClaimRefused.BUDGET (the study has dispatched
        its budget: counted under a lock of the study row, so concurrent controllers cannot overshoot)
        or ClaimRefused.DUPLICATE (this layout was already dispatched in the study). A deliberate repeat run of
        a measured layout passes its own `dispatch_key` (the layout's key plus a run number). A trial of
        another `origin` (a validation run) is outside the budget. With a `cap`, ClaimRefused.CAP when the study's
        runs, those in flight included, have held its --max-gpu-hours, counted under the same lock (review: each
        controller of a study checked it alone, so two could start a run each into the last room under it).
        """
        dispatch_key = dispatch_key or config_key

        def write(s: Session) -> Trial | ClaimRefused:
            # the stored budget too, read under the lock: `resume --budget` may have lowered it since this
            # controller read the study (review)
            stored = s.scalar(select(StudyRow.budget).where(StudyRow.id == study_id).with_for_update())
            dispatched = s.scalar(select(func.count()).select_from(TrialRow).where(
                TrialRow.study_id == study_id, TrialRow.dispatched.is_(True), IN_BUDGET))
            if dispatched >= min(budget, stored if stored is not None else budget) and origin == TrialOrigin.STUDY:
                return ClaimRefused.BUDGET
            if s.scalar(select(func.count()).select_from(TrialRow).where(
                    TrialRow.study_id == study_id, TrialRow.dispatch_key == dispatch_key)):
                return ClaimRefused.DUPLICATE
            if cap is not None and _cap_state(s, study_id, cap)[0]:
                return ClaimRefused.CAP
            now = utcnow()
            row = TrialRow(study_id=study_id, number=_next_number(s, study_id) if number is None else number,
                           config=config,
                           config_key=config_key, dispatch_key=dispatch_key, dispatched=True,
                           status=TrialRecordStatus.DISPATCHED.value, attempt=1,
                           optuna_trial_number=optuna_trial_number, predicted=predicted,
                           strategy_note=strategy_note, origin=TrialOrigin(origin).value, dispatched_at=now,
                           heartbeat_at=now, controller_id=controller_id)
            s.add(row)
            s.flush()
            return _trial(row)

        # a clash on the dispatch key (another controller claimed this layout) retries too, and the
        # retry then finds the layout dispatched
        return self._numbered(study_id, write)

    def add_imported(self, study_id: int, config: dict, config_key: str, optuna_trial_number: int, status: str,
                     metrics: dict[str, Any], step_times_s: list[float], source: str,
                     number: int | None = None) -> Trial:
        """A measured run that autotune did not dispatch (an imported log): outside the budget."""
        values = {k: metrics.get(k) for k in METRIC_FIELDS}
        return self._insert_trial(study_id, number, config=config, config_key=config_key, dispatched=True, status=status,
                                  optuna_trial_number=optuna_trial_number, origin=TrialOrigin.IMPORTED.value,
                                  step_times_s=stored_step_times(step_times_s),
                                  artifacts={"log": source}, finished_at=utcnow(),
                                  reason="out_of_memory" if status == "oom" else None, **values)

    def stale_trials(self, study_id: int, older_than_s: float, exclude_controller: str) -> list[Trial]:
        """Dispatched, unfinished trials of other controllers whose heartbeat stopped."""
        cutoff = utcnow() - dt.timedelta(seconds=older_than_s)
        with self._read() as s:
            rows = s.scalars(select(TrialRow).where(
                TrialRow.study_id == study_id, TrialRow.status == TrialRecordStatus.DISPATCHED.value,
                (TrialRow.controller_id.is_(None)) | (TrialRow.controller_id != exclude_controller),
                _heartbeat_stale(cutoff)).order_by(TrialRow.number))
            return [_trial(r) for r in rows]

    def adopt_trial(self, study_id: int, number: int, controller_id: str, stale_before: dt.datetime,
                    cap: GpuHourCap | None = None, held_gpu_seconds: float = 0.0) -> Adoption:
        """Take over a stale trial (compare-and-set on its heartbeat, so two adopters cannot both win): ADOPTED, or
        TAKEN when it is no longer stale (another adopter won, its controller came back).

        With a `cap` (the trial is to run again): checked first, under the study row's lock, as claim_dispatch checks
        a new run, with the time the dead attempt held (`held_gpu_seconds`) counted as spent. WAIT, with nothing
        written, while runs in flight fill the room (the trial stays stale, counted by nobody; a later pass may find
        room); CAP, adopted, when the cap is reached with none in flight (spent for good: the adopter ends it, not
        run again). Review of an earlier version that checked the cap after adopting, at the re-run: two adopters
        each counted the other's freshly adopted trial in flight, and both waited for ever."""
        with self.session() as s:
            reached = False
            if cap is not None:
                s.scalar(select(StudyRow.id).where(StudyRow.id == study_id).with_for_update())
                reached, live = _cap_state(s, study_id, cap, held_gpu_seconds=_gpu_time(held_gpu_seconds),
                                           starting=number)
                if reached and live:
                    return Adoption.WAIT
            result = s.execute(update(TrialRow).where(
                TrialRow.study_id == study_id, TrialRow.number == number, TrialRow.status == TrialRecordStatus.DISPATCHED.value,
                _heartbeat_stale(stale_before)).values(
                controller_id=controller_id, heartbeat_at=utcnow()))
            if result.rowcount != 1:
                return Adoption.TAKEN
            return Adoption.CAP if reached else Adoption.ADOPTED

    def release_trials(self, study_id: int, numbers: list[int], held_gpu_seconds: dict[int, float] | None = None) -> None:
        """Let go of dispatched trials this controller cancelled (an interruption): no heartbeat, so readers
        show them stopped at once and the next controller adopts them without waiting for staleness.
        `held_gpu_seconds`: what each stopped attempt held its GPUs, added to the trial's GPU time (review: an
        interrupted attempt's hours were never counted, against --max-gpu-hours or in the study's GPU-hours)."""
        if not numbers:
            return
        held = held_gpu_seconds or {}
        with self.session() as s:
            for number in numbers:
                s.execute(update(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number,
                                                 TrialRow.status == TrialRecordStatus.DISPATCHED.value)
                          .values(heartbeat_at=None,
                                  gpu_seconds=TrialRow.gpu_seconds + _gpu_time(held.get(number, 0.0))))

    def heartbeat_trials(self, study_id: int, numbers: list[int]) -> None:
        if not numbers:
            return
        with self.session() as s:
            s.execute(update(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number.in_(numbers))
                      .values(heartbeat_at=utcnow()))

    def finish_trial(self, study_id: int, number: int, status: str, *, reason: str | None = None,
                     message: str | None = None, metrics: dict[str, Any] | None = None,
                     step_times_s: list[float] | None = None, gpu_seconds: float = 0.0,
                     artifacts: dict[str, Any] | None = None, measured_terms_s: dict[str, float] | None = None) -> None:
        """`measured_terms_s`: the step's parts a trace measured (kept only when it is one, see
        _numbers.measured_terms, for a completed run with its step time)."""
        from autotune._numbers import measured_terms

        values: dict[str, Any] = {"status": status, "reason": reason, "message": message,
                                  "finished_at": utcnow(), "gpu_seconds": TrialRow.gpu_seconds + _gpu_time(gpu_seconds)}
        step_s = (metrics or {}).get("step_time_s")
        terms = measured_terms(measured_terms_s, step_s) if status == "completed" and step_s else None
        if terms is not None:
            values["measured_terms_s"] = terms
        for key in METRIC_FIELDS:
            # completed and OOM results were validated whole; a failed run's figures may be anything:
            # the store keeps only measurements its read side (_records) accepts
            if metrics and metrics.get(key) is not None and TRIAL_RULES[key][0](metrics[key]):
                values[key] = float(metrics[key])
        if step_times_s is not None:
            # a failed, pruned or timed-out run's step times reach here as the launcher reported them
            # (only completed and OOM results are validated whole): keep the plausible ones, so the store
            # holds nothing its read side (_records) would refuse
            values["step_times_s"] = stored_step_times(step_times_s)
        with self.session() as s:
            if artifacts:  # merge: keep what earlier attempts recorded (e.g. the messages of lost attempts)
                current = s.scalar(select(TrialRow.artifacts).where(TrialRow.study_id == study_id,
                                                                      TrialRow.number == number)) or {}
                values["artifacts"] = {**current, **artifacts}
            s.execute(update(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number).values(**values))

    def retry_trial(self, study_id: int, number: int, message: str, controller_id: str,
                    gpu_seconds: float = 0.0, worker_lost: bool = False) -> None:
        """A trial goes back to dispatched for its next attempt (its GPU time so far is kept).

        `worker_lost` counts the attempt as lost to a dead worker or node (column `worker_losses`, the
        messages in artifacts under `losses`): those get one retry; re-runs after a controller death
        do not count.
        """
        with self.session() as s:
            row = s.scalar(select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number))
            artifacts = dict(row.artifacts or {})
            if worker_lost:
                row.worker_losses = (row.worker_losses or 0) + 1
                artifacts["losses"] = [*artifacts.get("losses", []), message]
            row.status, row.attempt, row.message = TrialRecordStatus.DISPATCHED.value, row.attempt + 1, message
            row.dispatched_at = row.heartbeat_at = utcnow()
            row.controller_id, row.artifacts = controller_id, artifacts
            row.gpu_seconds = row.gpu_seconds + _gpu_time(gpu_seconds)

    def worker_losses(self, study_id: int, number: int) -> int:
        """How many attempts of this trial ended because its worker or node died."""
        return self.trial(study_id, number).worker_losses

    def trials(self, study_id: int, dispatched_only: bool = False) -> list[Trial]:
        with self._read() as s:
            query = select(TrialRow).where(TrialRow.study_id == study_id)
            if dispatched_only:
                query = query.where(TrialRow.dispatched.is_(True))
            return [_trial(r) for r in s.scalars(query.order_by(TrialRow.number))]

    def trial(self, study_id: int, number: int) -> Trial:
        with self._read() as s:
            row = s.scalar(select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.number == number))
            if row is None:  # named (found by review: "study has no trial 999" did not say which study)
                name = s.scalar(select(StudyRow.name).where(StudyRow.id == study_id))
                raise StudyError(f"study {name!r} has no trial {number}" if name is not None else
                                 f"no study with id {study_id} (asked for its trial {number})")
            return _trial(row)

    def gpu_seconds_spent(self, study_id: int) -> float:
        """GPU-seconds the study's own runs held (_spent_gpu_seconds)."""
        with self.session() as s:
            return _checked_spent(s, study_id)

    def cap_reached(self, study_id: int, cap: GpuHourCap) -> tuple[bool, int]:
        """Whether no run of the study may start under `cap` now, and how many of its runs are in flight under a
        live controller (_cap_state; claim_dispatch checks the same under the study row's lock)."""
        with self.session() as s:
            return _cap_state(s, study_id, cap)

    def counts(self, study_id: int) -> dict[str, int]:
        """How many trials were dispatched, rejected, and ended in each status."""
        origin = TrialRow.origin
        with self.session() as s:
            rows = s.execute(select(TrialRow.status, TrialRow.dispatched, origin, func.count()).where(
                TrialRow.study_id == study_id).group_by(TrialRow.status, TrialRow.dispatched, origin)).all()
        counts = {"dispatched": 0, "rejected": 0, "running": 0, "completed": 0, "oom": 0, "pruned": 0,
                  "failed": 0, "timeout": 0, "lost": 0, "imported": 0, "validation": 0}
        for status, dispatched, trial_origin, count in rows:
            if trial_origin == TrialOrigin.IMPORTED:
                counts["imported"] += count  # measured by hand: outside the budget and the status counts
            elif trial_origin == TrialOrigin.VALIDATION:
                counts["validation"] += count  # the winner's longer run after the study: outside the budget
            elif dispatched:
                counts["dispatched"] += count
                counts["running" if status == "dispatched" else status] += count
            else:
                counts["rejected"] += count
        return counts
