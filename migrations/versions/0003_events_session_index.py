"""Index a session's events by ``session_id`` alone, not ``(run_id, session_id)``.

With ``(run_id, session_id)`` a generic plan made before the tables had statistics looked a key up
(``run_id = $1 AND idem_key = $2``) through that index and filtered every event of the run, instead
of using the unique ``(run_id, idem_key)`` index. An index that does not start with ``run_id``
leaves the planner only the right choice; a session's events are still found by index.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 02:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_events_run_id_session_id", table_name="events")
    op.create_index("ix_events_session_id", "events", ["session_id"])


def downgrade() -> None:
    op.drop_index("ix_events_session_id", table_name="events")
    op.create_index("ix_events_run_id_session_id", "events", ["run_id", "session_id"])
