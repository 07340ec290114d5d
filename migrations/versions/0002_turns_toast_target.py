"""PostgreSQL: keep turn rows up to a page inline (toast_tuple_target = 8160).

A 512-token turn row is ~7.5 kB. With the default target (~2 kB) PostgreSQL moves its per-token
arrays into the TOAST table: every append writes three extra TOAST rows and index entries, and every
read fetches them back. Keeping rows of up to one page inline makes appends and read-backs cheaper;
longer turns are still TOASTed (with lz4, see 0001). SQLite is unchanged.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 21:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TURNS_TOAST_TUPLE_TARGET = 8160
"""The largest value PostgreSQL accepts: one 8 kB page minus its header."""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE turns SET (toast_tuple_target = {TURNS_TOAST_TUPLE_TARGET})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE turns RESET (toast_tuple_target)")
