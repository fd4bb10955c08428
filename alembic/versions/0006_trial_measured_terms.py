"""A trial keeps the parts of its step a trace measured (compute, exposed communication: seconds per step).

The calibration fits the cost model's step-time terms to the measured step times; a trial that ran under
Nsight Systems also says how much of its step was compute and how much exposed communication, which pins
the terms a whole step cannot tell apart (controller/physics.py). Nullable: a trial without a trace, and
every trial of an older store, has none.

Downgrade: the column goes (an older autotune never read it).

Revision ID: 0006_trial_measured_terms
Revises: 0005_study_pooled_cache
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_trial_measured_terms"
down_revision = "0005_study_pooled_cache"
branch_labels = None
depends_on = None


# In place, as 0005 (a batch that recreated the table would drop the old one: with foreign keys on,
# SQLite's cascade would delete what hangs off it).


def upgrade() -> None:
    with op.batch_alter_table("autotune_trials", recreate="never") as batch:
        batch.add_column(sa.Column("measured_terms_s", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_trials", recreate="never") as batch:
        batch.drop_column("measured_terms_s")
