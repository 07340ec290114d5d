"""Evaluation tasks: ``tasks.kind`` (``train`` | ``eval``) and ``tasks.eval_version``.

Eval tasks live in the same queue (same leases, sessions, rewards) but in their own index space,
so the unique key becomes ``(run_id, kind, task_index, sample_index)``; the ``trajectories`` view
shows ``kind`` and ``eval_version``. On SQLite the table is rebuilt (a unique constraint cannot be
dropped in place); dropping the old table would run ``ON DELETE SET NULL`` on
``sessions.task_id`` (foreign keys are on), so the links are saved first and put back.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 21:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dressage.store.views import create_view_statements, drop_view_statements

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_UNIQUE = "uq_tasks_run_id_task_index_sample_index"
NEW_UNIQUE = "uq_tasks_run_id_kind_task_index_sample_index"


def _save_session_links() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "CREATE TEMP TABLE _session_task_links AS SELECT id, task_id FROM sessions WHERE task_id IS NOT NULL"
        )


def _restore_session_links() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "UPDATE sessions SET task_id = (SELECT l.task_id FROM _session_task_links l WHERE l.id = sessions.id) "
            "WHERE id IN (SELECT id FROM _session_task_links)"
        )
        op.execute("DROP TABLE _session_task_links")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_view_statements():
        op.execute(statement)
    _save_session_links()
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=8), server_default="train", nullable=False))
        batch_op.add_column(sa.Column("eval_version", sa.Integer(), nullable=True))
        batch_op.drop_constraint(OLD_UNIQUE, type_="unique")
        batch_op.create_unique_constraint(NEW_UNIQUE, ["run_id", "kind", "task_index", "sample_index"])
    _restore_session_links()
    for statement in create_view_statements(dialect, revision="0004"):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_view_statements():
        op.execute(statement)
    op.execute("DELETE FROM tasks WHERE kind <> 'train'")
    _save_session_links()
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_constraint(NEW_UNIQUE, type_="unique")
        batch_op.create_unique_constraint(OLD_UNIQUE, ["run_id", "task_index", "sample_index"])
        batch_op.drop_column("eval_version")
        batch_op.drop_column("kind")
    _restore_session_links()
    for statement in create_view_statements(dialect, revision="0001"):
        op.execute(statement)
