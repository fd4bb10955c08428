"""autotune's own tables (SQLAlchemy 2). Optuna's tables live in the same database, owned by Optuna.

A study row holds what the study is (model, workload, space, budget, strategy, backend). A trial row
is one proposal: either rejected before dispatch (never ran, `dispatched` false) or dispatched to a
backend, with its status, metrics, timings, GPU-seconds and artifacts. Every trial of a study has a
unique `number` (see TrialNumbering); a layout is dispatched at most once per study (unique dispatch key).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

SCHEMA_REVISION = "0006_trial_measured_terms"  # the newest Alembic revision this code writes


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def storable_text(value: str | None) -> str | None:
    """`value` as every store's text column can keep it: a NUL, which PostgreSQL refuses in text, and a lone
    surrogate, which is no UTF-8 and which SQLite's driver refuses to encode, become U+FFFD. Found by an
    adversarial pass: a launcher's message with either stopped the controller with its trial dispatched, and
    every resume died the same way. (JSON columns escape both themselves.)"""
    if value is None or (value.isascii() and "\x00" not in value):
        return value
    return "".join("\ufffd" if c == "\x00" or "\ud800" <= c <= "\udfff" else c for c in value)


class StorableText(TypeDecorator):
    """Text written as every store can keep it (storable_text): the columns launcher text reaches."""
    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return storable_text(value)


class StudyStatus(enum.StrEnum):
    """A study's life: created -> running -> finished, or interrupted (resumable)."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


class TrialRecordStatus(enum.StrEnum):
    """A trial row's status: the backend outcomes (backends.TrialStatus) plus the two states a trial
    has before it has an outcome: rejected before dispatch, or dispatched and not yet ended."""

    REJECTED = "rejected"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    OOM = "oom"
    PRUNED = "pruned"
    FAILED = "failed"
    TIMEOUT = "timeout"
    LOST = "lost"


class TrialOrigin(enum.StrEnum):
    """Where a trial row comes from. Only STUDY trials count against the budget."""

    STUDY = "study"  # proposed by the study's strategy (dispatched or rejected)
    IMPORTED = "imported"  # a run measured by hand, imported from its log (`autotune import-log`)
    VALIDATION = "validation"  # a longer run of the winner after the budget (`--validate-steps`)


# Rejected layouts of an OPTUNA-numbered study are numbered from here up, so that they never take a
# number Optuna gives a run (runs are numbered 0, 1, 2, ... by Optuna; a study's runs are bounded by
# its budget, at most 10**6, plus validation and imported runs).
REJECTED_BASE = 1_000_000_000


class TrialNumbering(enum.StrEnum):
    """How a study numbers its trial rows."""

    # every run (study, validation, imported) is numbered with its Optuna trial number; layouts
    # rejected before dispatch are no Optuna trials and are numbered from REJECTED_BASE up
    OPTUNA = "optuna"
    # studies created before revision 0004: one sequence over all rows from 1, rejected ones included;
    # the Optuna trial number is only in `optuna_trial_number`
    SEQUENCE = "sequence"


class ClaimRefused(enum.StrEnum):
    """Why `Repository.claim_dispatch` recorded nothing."""

    BUDGET = "budget"  # the study has dispatched its budget
    DUPLICATE = "duplicate"  # this layout (dispatch key) is already dispatched in the study
    CAP = "cap"  # the study's runs, those in flight included, have held its --max-gpu-hours (GpuHourCap)


class Adoption(enum.StrEnum):
    """What `Repository.adopt_trial` did with a stale trial."""

    ADOPTED = "adopted"  # it is the adopter's now
    TAKEN = "taken"  # not stale any more: another adopter won, or its controller came back; nothing written
    WAIT = "wait"  # to run again, but runs in flight fill the GPU-hour cap's room for now; nothing written
    CAP = "cap"  # adopted, but the cap is spent with nothing in flight: ended by the adopter, not run again


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class StudyRow(Base):
    __tablename__ = "autotune_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model: Mapped[str] = mapped_column(String(100))
    workload: Mapped[dict[str, Any]] = mapped_column(JSON)
    space: Mapped[dict[str, Any]] = mapped_column(JSON)  # domains after --fix, policy, source file
    budget: Mapped[int] = mapped_column(Integer)
    sampler: Mapped[str] = mapped_column(String(40))
    backend: Mapped[str] = mapped_column(String(40))
    backend_options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # seed, timeouts, pruning settings
    optuna_study_name: Mapped[str] = mapped_column(String(250))  # the study's own name since revision 0004
    status: Mapped[str] = mapped_column(String(20), default=StudyStatus.CREATED.value)  # a StudyStatus value
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)
    controller_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    controller_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # a TrialNumbering value; revision 0004 marks the studies it found "sequence"
    numbering: Mapped[str] = mapped_column(String(20), default=TrialNumbering.OPTUNA.value,
                                           server_default=TrialNumbering.SEQUENCE.value)
    # the pooled estimates of the last recommendation and the digest of the runs they pool (revision 0005;
    # controller/recommend.py): a cache that spares readers the GP fit
    pooled_cache: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    trials: Mapped[list["TrialRow"]] = relationship(back_populates="study", cascade="all, delete-orphan")


class TrialRow(Base):
    __tablename__ = "autotune_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number", name="uq_trial_number"),
        UniqueConstraint("study_id", "dispatch_key", name="uq_trial_dispatch_key"),
        Index("ix_trial_study_status", "study_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    optuna_trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(Text)
    # Equal to config_key for dispatched trials, NULL otherwise: the unique constraint then says
    # "a layout is dispatched at most once per study", also across concurrent controllers.
    dispatch_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    dispatched: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(20))  # a TrialRecordStatus value
    reason: Mapped[str | None] = mapped_column(StorableText, nullable=True)  # rule name or failure class
    message: Mapped[str | None] = mapped_column(StorableText, nullable=True)  # human text, stderr tail
    implied_by_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)  # OOM-frontier source
    strategy_note: Mapped[str | None] = mapped_column(String(100), nullable=True)  # why the strategy chose it
    origin: Mapped[str] = mapped_column(String(20), default=TrialOrigin.STUDY.value,
                                        server_default=TrialOrigin.STUDY.value)  # a TrialOrigin value
    # attempts that ended because the worker or node died (one retry is granted for those)
    worker_losses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s_per_gpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    mfu: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_mem_gib: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_times_s: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # JSON text escapes a NUL and a lone surrogate itself (\u0000, \udce9): a path of non-UTF-8 bytes reads back
    # as written (review: replacing them broke a run folder's path)
    artifacts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # added by revision 0002: the cost model's prediction at proposal time, and the controller
    # that runs the trial (a controller adopts only trials whose owner stopped heartbeating)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    controller_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # added by revision 0006: the step's parts a trace measured (seconds per step; _numbers.MEASURED_TERMS)
    measured_terms_s: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    study: Mapped[StudyRow] = relationship(back_populates="trials")


TERMINAL_STATUSES = tuple(s.value for s in TrialRecordStatus if s not in (TrialRecordStatus.REJECTED,
                                                                          TrialRecordStatus.DISPATCHED))
