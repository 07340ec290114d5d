"""In-flight trajectory resume: an interrupted session is continued by the next attempt of its task.

When a worker dies, its task lease expires. A worker that reclaims the task with ``resume=True``
(see :meth:`~dressage.store.leases.LeaseMixin.claim_tasks`) leaves the dead attempt's session
``running`` instead of marking it ``abandoned``; its next episode takes the session over with
:meth:`ResumeMixin.resume_session`: the session row gets the new attempt number and a fresh bearer
token (the dead attempt's token stops working), its turns stay as they are, and a
``session_resumed`` event records the takeover. The proxy then answers the new agent's requests
that match the recorded turns from the log (see :mod:`dressage.proxy.replay`), so the trajectory
goes on as one session, one trajectory for the trainer, with no token generated twice.

``info["resume"]`` on the session row: ``attempt`` (the attempt that owns the session now),
``from_attempt``, ``seed_attempt`` (the attempt whose sampling seed the session keeps using, so a
resumed agent sends the requests the first one sent), ``next_turn`` (turns recorded when it was
taken over: the replay targets) and ``count`` (how many times it was resumed).
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Connection, func, select, update

from dressage.errors import InvalidRecordError, LeaseError
from dressage.store import schema as t
from dressage.store.members import StoreMembers
from dressage.store.records import Session, deterministic_key


class ResumeMixin(StoreMembers):
    """Session-takeover methods of :class:`~dressage.store.event_store.EventStore`."""

    def interrupted_session(self, task_id: int, attempt: int) -> Session | None:
        """The still-running session of an earlier attempt of task ``task_id``, or None.

        That is the session a worker that died (or lost its lease) left behind, kept running by a
        resuming claim; the latest one when there are several.
        """
        c = t.sessions.c
        with self._read() as conn:
            sid = conn.execute(
                select(c.id)
                .where(c.task_id == task_id, c.status == "running", c.attempt < attempt)
                .order_by(c.attempt.desc(), c.created_at.desc())
                .limit(1)
            ).scalar_one_or_none()
        return self.get_session(sid) if sid is not None else None

    def resume_session(self, session_id: str, *, attempt: int, token: str) -> Session:
        """Hand a running session over to ``attempt`` with bearer ``token``; records ``session_resumed``.

        Raises :class:`LeaseError` when the session is no longer running (finished or abandoned
        meanwhile) or already belongs to ``attempt`` or a later one. The old token stops working.
        """
        if attempt < 1:
            raise InvalidRecordError(f"attempt must be >= 1, got {attempt}")
        digest = hashlib.sha256(token.encode()).hexdigest()

        def tx(conn: Connection) -> None:
            row = conn.execute(
                select(t.sessions).where(t.sessions.c.id == session_id).with_for_update()
            ).first()
            if row is None:
                raise LeaseError(f"no session {session_id!r} to resume")
            if row.status != "running" or row.attempt >= attempt:
                raise LeaseError(
                    f"session {session_id} is {row.status} at attempt {row.attempt}; attempt {attempt} "
                    "cannot resume it"
                )
            next_turn = conn.execute(
                select(func.coalesce(func.max(t.turns.c.turn_index) + 1, 0)).where(
                    t.turns.c.run_id == row.run_id, t.turns.c.session_id == session_id
                )
            ).scalar_one()
            info: dict[str, Any] = dict(row.info or {})
            before = info.get("resume") or {}
            record = {
                "attempt": attempt,
                "from_attempt": int(row.attempt),
                "seed_attempt": int(before.get("seed_attempt", row.attempt)),
                "next_turn": int(next_turn),
                "count": int(before.get("count", 0)) + 1,
            }
            run = self.get_run_by_id(row.run_id)
            self._append_event_tx(
                conn,
                row.run_id,
                "session_resumed",
                record,
                key=deterministic_key(run.name, session_id, "resume", attempt),
                session_id=session_id,
            )
            conn.execute(
                update(t.sessions)
                .where(t.sessions.c.id == session_id)
                .values(attempt=attempt, token_sha256=digest, info={**info, "resume": record})
            )

        self._retrying(tx)
        return self.get_session(session_id)


def seed_attempt(session: Session) -> int:
    """The attempt whose sampling seed ``session`` uses (its first one, across resumes)."""
    resume = session.info.get("resume") if isinstance(session.info, dict) else None
    if isinstance(resume, dict) and isinstance(resume.get("seed_attempt"), int):
        return int(resume["seed_attempt"])
    return session.attempt
