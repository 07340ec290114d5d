"""Session forks: ``sessions.parent_session_id`` and ``sessions.fork_turn``, and the ``session_tree`` view.

``dressage-worker fork`` opens child sessions of a recorded session whose first ``fork_turn`` turns
are the parent's, replayed from the log; the two columns record where each child came from, and the
view walks the forks (parent, fork turn, depth, root). The columns are added in place on both
backends (a SQLite table rebuild would cascade-delete the sessions' artifacts), with no foreign key
(SQLite cannot add one in place): the store checks the parent when a fork opens, and a session
whose parent was dropped (a fork into another run outlives its parent's run) counts as a root.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 16:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dressage.store.views import SESSION_TREE

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_sessions_parent_session_id"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("parent_session_id", sa.String(length=64), nullable=True))
    op.add_column("sessions", sa.Column("fork_turn", sa.Integer(), nullable=True))
    op.create_index(INDEX, "sessions", ["parent_session_id"])
    op.execute(SESSION_TREE)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS session_tree")
    op.drop_index(INDEX, table_name="sessions")
    op.drop_column("sessions", "fork_turn")
    op.drop_column("sessions", "parent_session_id")
