"""A study keeps the pooled estimates of its last recommendation, so reading it needs no GP fit.

Every command that shows a recommendation (`status`, `leaderboard`, `show`, `export`, the dashboard)
pooled the study's runs with a Gaussian process (controller/recommend.py), which imports scikit-learn:
~2.5 s of a 3.6 s `autotune status` on a 2-core machine. The controller now stores the estimates with
a digest of the runs they were computed from; a reader whose runs have the same digest uses them, any
other reader computes them as before. A cache only: nothing is lost when it is empty or stale.

Downgrade: the column goes (an older autotune never read it).

Revision ID: 0005_study_pooled_cache
Revises: 0004_optuna_names_numbering
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_study_pooled_cache"
down_revision = "0004_optuna_names_numbering"
branch_labels = None
depends_on = None


# In place on every database (SQLite >= 3.35 adds and drops columns itself): a batch that recreated the
# studies table would drop the old one, and with foreign keys on, SQLite's cascade would delete every trial
# (as 0004 found).


def upgrade() -> None:
    with op.batch_alter_table("autotune_studies", recreate="never") as batch:
        batch.add_column(sa.Column("pooled_cache", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autotune_studies", recreate="never") as batch:
        batch.drop_column("pooled_cache")
