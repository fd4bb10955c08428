"""Storage: autotune's tables (SQLAlchemy 2 + Alembic) beside Optuna's, in SQLite or PostgreSQL."""

from autotune.storage._records import MAX_STUDY_NAME, is_study_name
from autotune.storage._engine import (default_storage_url, engine_kwargs, make_engine, normalize_url, sqlite_path,
                                      use_store_pragmas)
from autotune.storage.migrations import current_revision, ensure_schema, head_revision, upgrade
from autotune.storage.models import (REJECTED_BASE, Adoption, ClaimRefused, StudyStatus, TrialNumbering, TrialOrigin,
                                     TrialRecordStatus)
from autotune.storage.repository import Repository, Study, Trial

__all__ = ["MAX_STUDY_NAME", "REJECTED_BASE", "Adoption", "ClaimRefused", "Repository", "Study", "StudyStatus", "Trial",
           "TrialNumbering", "TrialOrigin", "TrialRecordStatus", "current_revision", "default_storage_url",
           "engine_kwargs", "ensure_schema", "head_revision", "is_study_name", "make_engine", "normalize_url",
           "sqlite_path", "upgrade", "use_store_pragmas"]
