"""Sandbox checkpoints: ``sandbox_checkpoints``, ``sandbox_checkpoint_changes`` and the
``workspace_changes`` view.

At each turn boundary the worker captures its sandbox's writable state as a content-addressed
manifest (:mod:`dressage.paddock.checkpoints`); the log keeps one row per (session, turn) with the
manifest's sha256 and URI (its files' bytes are blobs, stored once), each path it changed against
the checkpoint before, and a ``checkpoint`` event (:mod:`dressage.store.sandbox_checkpoints`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 10:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dressage.store.views import WORKSPACE_CHANGES

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sandbox_checkpoints",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("manifest_uri", sa.Text(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("hashed_bytes", sa.BigInteger(), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=True),
        sa.Column("request_uri", sa.Text(), nullable=True),
        sa.Column("prompt_digest", sa.String(length=64), nullable=True),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("session_id", "turn_index"),
    )
    op.create_table(
        "sandbox_checkpoint_changes",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("change", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=True),
        sa.Column("mode", sa.Integer(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id", "turn_index"],
            ["sandbox_checkpoints.session_id", "sandbox_checkpoints.turn_index"],
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "turn_index", "path"),
    )
    op.execute(WORKSPACE_CHANGES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS workspace_changes")
    op.drop_table("sandbox_checkpoint_changes")
    op.drop_table("sandbox_checkpoints")
