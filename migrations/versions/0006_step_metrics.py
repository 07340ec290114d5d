"""Step metrics: ``train_step_metrics`` (one row per step and metric) and the ``step_metrics`` view.

A trainer records each step's metrics (loss, grad norm, importance-ratio statistics, staleness,
reward of the batch...) in the same transaction as the step's manifest; the view pivots the
common ones into one row per step (:func:`dressage.store.views.step_metrics_view`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dressage.store.views import step_metrics_view

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "train_step_metrics",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(length=200), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "consumer", "step", "name"),
    )
    op.execute(step_metrics_view())


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS step_metrics")
    op.drop_table("train_step_metrics")
