"""The first released schema: studies and trials.

Revision ID: 0001_initial
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotune_studies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("workload", sa.JSON, nullable=False),
        sa.Column("space", sa.JSON, nullable=False),
        sa.Column("budget", sa.Integer, nullable=False),
        sa.Column("sampler", sa.String(40), nullable=False),
        sa.Column("backend", sa.String(40), nullable=False),
        sa.Column("backend_options", sa.JSON, nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("optuna_study_name", sa.String(250), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("controller_heartbeat_at", sa.DateTime, nullable=True),
        sa.Column("controller_id", sa.String(100), nullable=True),
    )
    op.create_table(
        "autotune_trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("autotune_studies.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("optuna_trial_number", sa.Integer, nullable=True),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("config_key", sa.Text, nullable=False),
        sa.Column("dispatch_key", sa.Text, nullable=True),
        sa.Column("dispatched", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("implied_by_trial", sa.Integer, nullable=True),
        sa.Column("strategy_note", sa.String(100), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step_time_s", sa.Float, nullable=True),
        sa.Column("tokens_per_s_per_gpu", sa.Float, nullable=True),
        sa.Column("tflops_per_gpu", sa.Float, nullable=True),
        sa.Column("mfu", sa.Float, nullable=True),
        sa.Column("peak_mem_gib", sa.Float, nullable=True),
        sa.Column("step_times_s", sa.JSON, nullable=False),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("artifacts", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("dispatched_at", sa.DateTime, nullable=True),
        sa.Column("finished_at", sa.DateTime, nullable=True),
        sa.Column("heartbeat_at", sa.DateTime, nullable=True),
        sa.UniqueConstraint("study_id", "number", name="uq_trial_number"),
        sa.UniqueConstraint("study_id", "dispatch_key", name="uq_trial_dispatch_key"),
    )
    op.create_index("ix_trial_study_status", "autotune_trials", ["study_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_trial_study_status", table_name="autotune_trials")
    op.drop_table("autotune_trials")
    op.drop_table("autotune_studies")
