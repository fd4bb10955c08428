"""The Optuna study carries the autotune study's name, and a study records how it numbers its trials.

Up to revision 0003 the Optuna study of study NAME was called `autotune:NAME` (so
`optuna.load_study(study_name=NAME)` failed), and its trial numbers were not autotune's. This revision
renames each such Optuna study to NAME (Optuna's `studies.study_name`) and `optuna_study_name` with it;
gives it the objective's name and autotune's ownership mark (the study system attributes autotune sets on
the studies it creates); and writes every recorded trial's metrics, status and reason as user attributes
of its Optuna trial, which optuna-dashboard shows. A study whose plain name another Optuna study already
holds keeps its `autotune:` name (`optuna_study_name` says which one is its own).

The studies found here keep their numbers (one sequence over all rows, rejected ones included: numbering
"sequence"); studies created from now on number each run with its Optuna trial number ("optuna").

Downgrade: the Optuna studies get their `autotune:` names back and the column goes. An older autotune
numbers new trials above the highest number of the study, so the new trials of a study created under this
revision (whose rejected layouts are numbered from 10**9) are numbered above 10**9 there; the user
attributes stay (they change nothing for an older autotune).

Revision ID: 0004_optuna_names_numbering
Revises: 0003_trial_origin_worker_losses
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004_optuna_names_numbering"
down_revision = "0003_trial_origin_worker_losses"
branch_labels = None
depends_on = None

OLD_PREFIX = "autotune:"
# the same keys and values as autotune/controller/_optuna.py writes (copied: a migration must not change
# when the code does)
METRIC_NAMES_KEY, METRIC_NAMES = "study:metric_names", ["tokens_per_s_per_gpu"]
OWNER_KEY = "autotune:study"
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_mem_gib")

studies = sa.table("autotune_studies", sa.column("id", sa.Integer), sa.column("name", sa.String),
                   sa.column("optuna_study_name", sa.String), sa.column("backend", sa.String))
trials = sa.table("autotune_trials", sa.column("study_id", sa.Integer), sa.column("optuna_trial_number", sa.Integer),
                  sa.column("status", sa.String), sa.column("reason", sa.Text), sa.column("message", sa.Text),
                  sa.column("origin", sa.String), sa.column("strategy_note", sa.String),
                  *(sa.column(m, sa.Float) for m in METRICS))
# Optuna's own tables (present once an Optuna storage has used the database)
optuna_studies = sa.table("studies", sa.column("study_id", sa.Integer), sa.column("study_name", sa.String))
optuna_study_attrs = sa.table("study_system_attributes", sa.column("study_id", sa.Integer),
                              sa.column("key", sa.String), sa.column("value_json", sa.Text))
optuna_trials = sa.table("trials", sa.column("trial_id", sa.Integer), sa.column("study_id", sa.Integer),
                         sa.column("number", sa.Integer))
optuna_trial_attrs = sa.table("trial_user_attributes", sa.column("trial_id", sa.Integer),
                              sa.column("key", sa.String), sa.column("value_json", sa.Text))


def _has_optuna(connection) -> bool:
    tables = set(sa.inspect(connection).get_table_names())
    return {"studies", "study_system_attributes", "trials", "trial_user_attributes"} <= tables


def _optuna_id(connection, name: str) -> int | None:
    return connection.scalar(sa.select(optuna_studies.c.study_id).where(optuna_studies.c.study_name == name))


def _add_attrs(connection, table, owner_column: str, owner_id: int, attrs: dict) -> None:
    """Insert the attributes the owner (study or trial) does not have yet."""
    owner = getattr(table.c, owner_column)
    have = set(connection.scalars(sa.select(table.c.key).where(owner == owner_id)))
    rows = [{owner_column: owner_id, "key": k, "value_json": json.dumps(v)} for k, v in attrs.items() if k not in have]
    if rows:
        connection.execute(table.insert(), rows)


def _trial_attrs(row, backend: str) -> dict:
    attrs = {"backend": backend, "simulated": backend == "simulate", "origin": row.origin, "status": row.status}
    if row.strategy_note:
        attrs["strategy"] = row.strategy_note
    if row.reason:
        attrs["reason"] = row.reason
    if row.message and row.status != "completed":
        attrs["message"] = row.message[:500]
    attrs.update({m: getattr(row, m) for m in METRICS if getattr(row, m) is not None})
    return attrs


def upgrade() -> None:
    # ALTER TABLE in place, never a copy: SQLite would drop the old table, and with it (ON DELETE CASCADE,
    # foreign keys on) every trial
    with op.batch_alter_table("autotune_studies", recreate="never") as batch:
        batch.add_column(sa.Column("numbering", sa.String(20), nullable=False, server_default="sequence"))
    connection = op.get_bind()
    optuna = _has_optuna(connection)
    for study in connection.execute(sa.select(studies)).all():
        if study.optuna_study_name != OLD_PREFIX + study.name:
            continue
        if optuna:
            if _optuna_id(connection, study.name) is not None:
                continue  # the plain name is another Optuna study's: keep the old name
            connection.execute(optuna_studies.update().where(optuna_studies.c.study_name == study.optuna_study_name)
                               .values(study_name=study.name))
            optuna_id = _optuna_id(connection, study.name)
            if optuna_id is not None:
                _add_attrs(connection, optuna_study_attrs, "study_id", optuna_id,
                           {METRIC_NAMES_KEY: METRIC_NAMES, OWNER_KEY: study.name})
                numbers = dict(connection.execute(sa.select(optuna_trials.c.number, optuna_trials.c.trial_id)
                                                  .where(optuna_trials.c.study_id == optuna_id)).all())
                for row in connection.execute(sa.select(trials).where(trials.c.study_id == study.id,
                                                                      trials.c.optuna_trial_number.is_not(None))):
                    if row.optuna_trial_number in numbers:
                        _add_attrs(connection, optuna_trial_attrs, "trial_id", numbers[row.optuna_trial_number],
                                   _trial_attrs(row, study.backend))
        connection.execute(studies.update().where(studies.c.id == study.id).values(optuna_study_name=study.name))


def downgrade() -> None:
    connection = op.get_bind()
    optuna = _has_optuna(connection)
    for study in connection.execute(sa.select(studies).where(studies.c.optuna_study_name == studies.c.name)).all():
        old = OLD_PREFIX + study.name
        if optuna:
            if _optuna_id(connection, old) is not None:
                continue  # taken: this study keeps its plain name, which `optuna_study_name` still gives
            connection.execute(optuna_studies.update().where(optuna_studies.c.study_name == study.name)
                               .values(study_name=old))
        connection.execute(studies.update().where(studies.c.id == study.id).values(optuna_study_name=old))
    with op.batch_alter_table("autotune_studies", recreate="never") as batch:  # in place (SQLite >= 3.35)
        batch.drop_column("numbering")
