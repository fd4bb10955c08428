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
    # JSON differs per database: read the rows that may carry a count and write it back in Python
    for row in connection.execute(sa.select(trials.c.id, trials.c.artifacts)).all():
        losses = (row.artifacts or {}).get("worker_losses") if isinstance(row.artifacts, dict) else None
        if losses:
            connection.execute(trials.update().where(trials.c.id == row.id).values(worker_losses=int(losses)))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials") as batch:
        batch.drop_column("worker_losses")
        batch.drop_column("origin")
