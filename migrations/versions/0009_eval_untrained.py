"""``trajectories.n_trained_tokens`` is 0 for eval sessions.

Eval sessions are never trained, but their turns record the loss mask the proxy gave every sampled
token, so summing ``n_trained`` counted their tokens as trained. The view is recreated with the
eval case (:data:`dressage.store.views.TRAJECTORIES`); no table changes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from dressage.store.views import trajectories_view

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trajectories")
    op.execute(trajectories_view("0009"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS trajectories")
    op.execute(trajectories_view("0004"))
