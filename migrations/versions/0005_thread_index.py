"""Rename ``turns.lineage_index`` to ``turns.thread_index``; keep ``lineage_index`` one release.

In the log the number names an agent context (a thread of the session: 0 for the first one, a new
one per ``new_conversation``); "lineage" is what TITO calls a segment. The old name stays as a
read-only generated column (``GENERATED ALWAYS AS (thread_index)``: stored on PostgreSQL, virtual
on SQLite) so that users' queries keep working for one release; writers use ``thread_index``. The
views do not show the column; they are dropped and created again around the rename.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 13:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from dressage.store.views import create_view_statements, drop_view_statements

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _generated_column_sql(dialect: str) -> str:
    kind = "STORED" if dialect == "postgresql" else "VIRTUAL"
    return f"ALTER TABLE turns ADD COLUMN lineage_index INTEGER GENERATED ALWAYS AS (thread_index) {kind}"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_view_statements():
        op.execute(statement)
    op.execute("ALTER TABLE turns RENAME COLUMN lineage_index TO thread_index")
    op.execute(_generated_column_sql(dialect))
    for statement in create_view_statements(dialect, revision="0004"):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_view_statements():
        op.execute(statement)
    op.execute("ALTER TABLE turns DROP COLUMN lineage_index")
    op.execute("ALTER TABLE turns RENAME COLUMN thread_index TO lineage_index")
    for statement in create_view_statements(dialect, revision="0004"):
        op.execute(statement)
