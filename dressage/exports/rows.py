"""Reading a run out of the log for an export: sessions with their tasks, turns in batches.

Everything here reads; nothing writes. Turns come through :func:`~dressage.store.turn_io.fetch_turn_rows`
(the same decoding as the trainer's reads) one batch of sessions at a time, so memory is bounded
by the batch, not the run.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, select

from dressage.store import schema as t
from dressage.store.event_store import EventStore
from dressage.store.records import Run, Turn, decode_experts
from dressage.store.turn_io import fetch_turn_rows, turn_from_row


def session_rows(store: EventStore, run: Run) -> list[dict[str, Any]]:
    """Every session of ``run`` with its task's kind and indexes, ordered by session id."""
    s, k = t.sessions, t.tasks
    q = (
        select(
            s.c.id.label("session_id"),
            k.c.kind,
            k.c.task_index,
            k.c.group_index,
            k.c.sample_index,
            k.c.eval_version,
            s.c.attempt,
            s.c.agent,
            s.c.sandbox,
            s.c.status,
            s.c.reward,
            s.c.finish_reason,
            s.c.error,
            s.c.info,
            s.c.created_at,
            s.c.finished_at,
            s.c.parent_session_id,
            s.c.fork_turn,
        )
        .select_from(s.outerjoin(k, k.c.id == s.c.task_id))
        .where(s.c.run_id == run.id)
        .order_by(s.c.id)
    )
    with store.db.read() as conn:
        return [dict(row) for row in conn.execute(q).mappings()]


def turn_rows(store: EventStore, run: Run, session_ids: list[str]) -> list[dict[str, Any]]:
    """The stored turn rows of ``session_ids`` (arrays as numpy), by session then turn index."""
    if not session_ids:
        return []
    params: dict[str, Any] = {"run_id": run.id}
    if store.db.dialect == "postgresql":
        where = "run_id = %(run_id)s AND session_id = ANY(%(ids)s)"
        params["ids"] = list(session_ids)
    else:
        names = [f"s{i}" for i in range(len(session_ids))]
        where = f"run_id = %(run_id)s AND session_id IN ({', '.join(f'%({n})s' for n in names)})"
        params.update(zip(names, session_ids, strict=True))
    with store.db.read() as conn:
        rows = fetch_turn_rows(conn, where, params, with_experts=True)
    for row in rows:
        row["routed_experts"] = decode_experts(
            row["experts"], row["experts_shape"], row["experts_dtype"], row["experts_codec"]
        )
    return rows


def as_turn(row: dict[str, Any]) -> Turn:
    """A :class:`Turn` from a row of :func:`turn_rows` (for the trainer's materialization)."""
    return turn_from_row(row, row["routed_experts"])


def table_rows(store: EventStore, run: Run, table: Table, order: list[str]) -> list[dict[str, Any]]:
    """All rows of an archive table for ``run`` (small tables: tasks, versions, steps, artifacts)."""
    q = select(table).where(table.c.run_id == run.id).order_by(*(table.c[c] for c in order))
    with store.db.read() as conn:
        return [dict(row) for row in conn.execute(q).mappings()]
