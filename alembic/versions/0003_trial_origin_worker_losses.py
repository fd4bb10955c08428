"""Columns for what hid in other fields: a trial's origin (was a strategy-note value) and the count of
attempts lost to a dead worker or node (was a key in the artifacts JSON).

Revision ID: 0003_trial_origin_worker_losses
Revises: 0002_trial_prediction_owner
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_trial_origin_worker_losses"
down_revision = "0002_trial_prediction_owner"
branch_labels = None
depends_on = None

trials = sa.table("autotune_trials", sa.column("id", sa.Integer), sa.column("strategy_note", sa.String),
                  sa.column("artifacts", sa.JSON), sa.column("origin", sa.String),
                  sa.column("worker_losses", sa.Integer))


def upgrade() -> None:
    with op.batch_alter_table("autotune_trials") as batch:
        batch.add_column(sa.Column("origin", sa.String(20), nullable=False, server_default="study"))
        batch.add_column(sa.Column("worker_losses", sa.Integer, nullable=False, server_default="0"))
    connection = op.get_bind()
    # the two notes that were types become origins; the note itself is left as the strategy wrote it
    for origin in ("imported", "validation"):
        connection.execute(trials.update().where(trials.c.strategy_note == origin).values(origin=origin))
    # JSON differs per database: read the rows that carry a count and move it in Python (the key
    # leaves the artifacts, so the column is the only count)
    for row in connection.execute(sa.select(trials.c.id, trials.c.artifacts)).all():
        artifacts = row.artifacts if isinstance(row.artifacts, dict) else {}
        if "worker_losses" in artifacts:
            losses = int(artifacts.pop("worker_losses") or 0)
            connection.execute(trials.update().where(trials.c.id == row.id)
                               .values(worker_losses=losses, artifacts=artifacts))


def downgrade() -> None:
    # put both back where revision 0002's code reads them, or an older controller would count imported
    # and validation runs against the budget and grant a lost trial its retry again
    connection = op.get_bind()
    for origin in ("imported", "validation"):
        connection.execute(trials.update().where(trials.c.origin == origin).values(strategy_note=origin))
    rows = connection.execute(sa.select(trials.c.id, trials.c.artifacts, trials.c.worker_losses)
                              .where(trials.c.worker_losses > 0)).all()
    for row in rows:
        artifacts = {**(row.artifacts if isinstance(row.artifacts, dict) else {}), "worker_losses": row.worker_losses}
        connection.execute(trials.update().where(trials.c.id == row.id).values(artifacts=artifacts))
    with op.batch_alter_table("autotune_trials") as batch:
        batch.drop_column("worker_losses")
        batch.drop_column("origin")
