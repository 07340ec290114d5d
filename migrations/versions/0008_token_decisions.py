"""Per-token training decisions: ``train_token_decisions``, ``mask_reasons`` and the
``token_decisions`` view; the ``step_metrics`` view gains ``kl_reference`` and ``kl_loss``.

Each trained sample of a step records its advantage, each response token's mask reason code and
(when the backend computed them) its importance weights, in the step's transaction; the view joins
them to ``token_events`` (:mod:`dressage.store.decisions`). ``mask_reasons`` holds the reason
vocabulary as of this revision (``dressage.training.masking.MASK_REASONS``; append only).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dressage.store.types import FloatArray, SmallIntArray
from dressage.store.views import step_metrics_view, token_decisions_view

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REASONS_0008 = (
    ("trained", "not masked: the token is trained"),
    ("prompt", "before the sample's response (its first trained token): the prompt"),
    ("not_generated", "a context token inside the response (tool result, user message): not sampled"),
    ("recorded_untrained", "sampled by the policy but recorded with loss mask 0 (e.g. an abandoned turn)"),
    ("stale", "sampled by a policy more than max_staleness versions behind the trained weights"),
    ("not_last_version", "last_version_only: sampled before the newest policy version of its segment"),
    ("tree_shared", "reserved: a prefix a trajectory tree trains once, in another sample"),
)
"""The vocabulary as of this revision (frozen here: a later reason is inserted by a later migration)."""


def upgrade() -> None:
    op.create_table(
        "train_token_decisions",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("consumer", sa.String(length=200), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("sample", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("segment_index", sa.Integer(), nullable=False),
        sa.Column("response_start", sa.Integer(), nullable=False),
        sa.Column("advantage", sa.Float(precision=53), nullable=False),
        sa.Column("mask_reasons", SmallIntArray(), nullable=False),
        sa.Column("importance_weights", FloatArray(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "consumer", "step", "sample"),
    )
    op.create_index(
        "ix_train_token_decisions_session_id_segment_index",
        "train_token_decisions",
        ["session_id", "segment_index"],
    )
    reasons = op.create_table(
        "mask_reasons",
        sa.Column("code", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("meaning", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("code"),
        sa.UniqueConstraint("reason", name="uq_mask_reasons_reason"),
    )
    op.bulk_insert(
        reasons, [{"code": i, "reason": name, "meaning": text} for i, (name, text) in enumerate(REASONS_0008)]
    )
    op.execute(token_decisions_view(op.get_bind().dialect.name))
    op.execute("DROP VIEW IF EXISTS step_metrics")  # again, with the reference model's columns
    op.execute(step_metrics_view())


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS token_decisions")
    op.drop_table("mask_reasons")
    op.drop_index("ix_train_token_decisions_session_id_segment_index", table_name="train_token_decisions")
    op.drop_table("train_token_decisions")
