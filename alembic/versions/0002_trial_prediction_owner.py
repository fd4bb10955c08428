"""Store the cost model's prediction with each trial, and the controller that owns a running trial.

Revision ID: 0002_trial_prediction_owner
Revises: 0001_initial
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_trial_prediction_owner"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("autotune_trials") as batch:
        batch.add_column(sa.Column("predicted", sa.JSON, nullable=True))
        batch.add_column(sa.Column("controller_id", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials") as batch:
        batch.drop_column("controller_id")
        batch.drop_column("predicted")
