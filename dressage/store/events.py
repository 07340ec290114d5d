"""Events in the log: append one (idempotent by key), read a range, tail the log."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from sqlalchemy import func, select

from dressage.store import schema as t
from dressage.store.database import Database
from dressage.store.records import AppendResult, Event, Run, check_text
from dressage.store.runs import RunRepository


class EventRepository:
    """The run's event sequence (every other repository appends its events through the same path)."""

    def __init__(self, db: Database, runs: RunRepository) -> None:
        self.db = db
        self.runs = runs

    def append(
        self,
        run: str | Run,
        kind: str,
        payload: Mapping[str, object] | None = None,
        *,
        key: str | None = None,
        session_id: str | None = None,
    ) -> AppendResult:
        """Append an event of ``kind``; with a ``key`` a retry returns the stored position."""
        check_text(kind, what="event kind", max_chars=64)
        r = self.runs.get(run)
        return self.db.retrying(
            lambda conn: self.db.append_event_tx(
                conn, r.id, kind, payload or {}, key=key, session_id=session_id
            )
        )

    def read(
        self, run: str | Run, after: int = 0, limit: int = 1000, kinds: tuple[str, ...] = ()
    ) -> list[Event]:
        """Events with ``position > after`` in position order (at most ``limit``)."""
        r = self.runs.get(run)
        q = select(t.events).where(t.events.c.run_id == r.id, t.events.c.position > after)
        if kinds:
            q = q.where(t.events.c.kind.in_(kinds))
        with self.db.read() as conn:
            rows = conn.execute(q.order_by(t.events.c.position).limit(limit)).all()
        return [
            Event(
                x.run_id,
                x.position,
                x.kind,
                x.session_id,
                x.idem_key,
                x.content_hash,
                x.payload,
                x.created_at,
            )
            for x in rows
        ]

    def tail(
        self, run: str | Run, after: int = 0, *, follow: bool = False, poll_s: float = 0.2, batch: int = 1000
    ) -> Iterator[Event]:
        """Yield events after ``after`` in order; with ``follow``, keep polling for new ones."""
        while True:
            events = self.read(run, after, batch)
            yield from events
            if events:
                after = events[-1].position
                continue
            if not follow:
                return
            time.sleep(poll_s)

    def last_position(self, run: str | Run) -> int:
        """The position of the run's newest event (0 when empty)."""
        return self.runs.last_position(run)

    def count_by_kind(self, run: str | Run, session_id: str) -> dict[str, int]:
        """How many events of each kind a session has, by kind (one indexed query)."""
        r = self.runs.get(run)
        e = t.events.c
        q = (
            select(e.kind, func.count())
            .where(e.run_id == r.id, e.session_id == session_id)
            .group_by(e.kind)
            .order_by(e.kind)
        )
        with self.db.read() as conn:
            return {str(kind): int(n) for kind, n in conn.execute(q).all()}
