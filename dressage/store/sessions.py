"""Sessions (trajectories) in the log: open, finalize, look up, and take over an interrupted one.

Session takeover: when a worker dies, its task lease expires. A worker that reclaims the task with
``resume=True`` (see :meth:`~dressage.store.tasks.TaskRepository.claim`) leaves the dead attempt's
session ``running`` instead of marking it ``abandoned``; its next episode takes the session over
with :meth:`SessionRepository.take_over`: the session row gets the new attempt number and a fresh
bearer token (the dead attempt's token stops working), its turns stay as they are, and a
``session_resumed`` event records the takeover. The proxy then answers the new agent's requests
that match the recorded turns from the log (see :mod:`dressage.proxy.replay`), so the trajectory
goes on as one session, one trajectory for the trainer, with no token generated twice.

``info["resume"]`` on the session row: ``attempt`` (the attempt that owns the session now),
``from_attempt``, ``seed_attempt`` (the attempt whose sampling seed the session keeps using, so a
resumed agent sends the requests the first one sent), ``next_turn`` (turns recorded when it was
taken over: the replay targets) and ``count`` (how many times it was taken over).
"""

from __future__ import annotations

import builtins
import hashlib
import math
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from sqlalchemy import Connection, Row, func, insert, select, update

from dressage.errors import (
    IdempotencyConflictError,
    InvalidRecordError,
    LeaseError,
    UnknownSessionError,
)
from dressage.redact import redact
from dressage.store import schema as t
from dressage.store.database import Database
from dressage.store.records import (
    SESSION_STATUSES,
    TERMINAL_STATUSES,
    Run,
    Session,
    SessionHead,
    SessionOpening,
    SessionOutcome,
    canonical_json,
    check_text,
    deterministic_key,
)
from dressage.store.runs import RunRepository

if TYPE_CHECKING:
    from dressage.store.turn_appenders import TurnAppender


def read_session_head(db: Database, session_id: str) -> SessionHead:
    """Status, turns recorded and attempt of a session in one indexed read."""
    last = select(func.max(t.turns.c.turn_index)).where(t.turns.c.session_id == session_id).scalar_subquery()
    with db.read() as conn:
        row = conn.execute(
            select(t.sessions.c.status, last, t.sessions.c.attempt).where(t.sessions.c.id == session_id)
        ).first()
    if row is None:
        raise UnknownSessionError(f"no session {session_id!r} in the log")
    return SessionHead(str(row[0]), 0 if row[1] is None else int(row[1]) + 1, int(row[2]))


def _check_task_of_run(conn: Connection, task_id: int, run: Run) -> None:
    """Refuse a session's ``task_id`` that is not a task of its run (the foreign key would say it
    in the database's words, naming tables; a task of another run it would not refuse at all)."""
    found = conn.execute(
        select(t.tasks.c.id).where(t.tasks.c.id == task_id, t.tasks.c.run_id == run.id)
    ).scalar_one_or_none()
    if found is None:
        raise InvalidRecordError(f"task_id {task_id} is not a task of run {run.name!r}", field="task_id")


class SessionRepository:
    """Sessions of the log's runs."""

    def __init__(self, db: Database, runs: RunRepository, appender: TurnAppender) -> None:
        self.db = db
        self.runs = runs
        self._appender = appender

    def open(
        self,
        run: str | Run,
        *,
        session_id: str | None = None,
        token: str | None = None,
        **opening: Unpack[SessionOpening],
    ) -> Session:
        """Start a session (trajectory); idempotent for an explicit ``session_id``."""
        task_id, attempt, info = opening.get("task_id"), opening.get("attempt", 1), opening.get("info")
        agent, sandbox = opening.get("agent"), opening.get("sandbox")
        r = self.runs.get(run)
        sid = session_id or uuid.uuid4().hex
        check_text(sid, what="session_id", max_chars=64)
        for name, value in (("agent", agent), ("sandbox", sandbox)):
            check_text(value, what=name, max_chars=200)
        info = dict(info or {})
        canonical_json(info, what="session info", max_bytes=self.db.max_payload_bytes)
        token_sha = hashlib.sha256(token.encode()).hexdigest() if token else None
        parent, fork_turn = self._fork_point(opening.get("parent_session_id"), opening.get("fork_turn"))
        payload = {"task_id": task_id, "attempt": attempt, "agent": agent, "sandbox": sandbox, "info": info}
        if parent is not None:
            payload |= {"parent_session_id": parent, "fork_turn": fork_turn}

        def tx(conn: Connection) -> None:
            if task_id is not None:
                _check_task_of_run(conn, task_id, r)
            key = deterministic_key(r.name, sid, "start")
            res = self.db.append_event_tx(conn, r.id, "session_started", payload, key=key, session_id=sid)
            if res.duplicate:
                return
            conn.execute(
                insert(t.sessions).values(
                    id=sid,
                    run_id=r.id,
                    task_id=task_id,
                    attempt=attempt,
                    agent=agent,
                    sandbox=sandbox,
                    status="running",
                    token_sha256=token_sha,
                    info=info,
                    created_at=time.time(),
                    parent_session_id=parent,
                    fork_turn=fork_turn,
                )
            )

        self.db.retrying(tx)
        return self.get(sid)

    def _fork_point(self, parent: str | None, fork_turn: int | None) -> tuple[str | None, int | None]:
        """Check a fork's parent and turn: both or neither, the parent recorded, the turn within it."""
        if parent is None and fork_turn is None:
            return None, None
        if parent is None or fork_turn is None:
            raise ValueError("a fork names both parent_session_id and fork_turn (or neither)")
        if isinstance(fork_turn, bool) or not isinstance(fork_turn, int) or fork_turn < 0:
            raise ValueError(f"fork_turn must be an integer >= 0, got {fork_turn!r}")
        recorded = self.head(parent).turns
        if fork_turn > recorded:
            raise ValueError(f"fork_turn {fork_turn} is past session {parent!r}'s {recorded} recorded turns")
        return parent, fork_turn

    def finalize(self, session_id: str, status: str, **outcome: Unpack[SessionOutcome]) -> Session:
        """Move a running session to a terminal status with its reward, atomically and idempotently.

        Finalizing again with the same status and reward returns the session unchanged; a different
        outcome for a session that is already terminal raises :class:`IdempotencyConflictError`.
        With ``attempt``, a running session that another attempt has taken over (see
        :meth:`take_over`) is not finalized: :class:`LeaseError`. ``info`` replaces the session's
        info but keeps its ``resume`` record and, unless ``info`` names one, how it started
        (``start``: from a sandbox checkpoint or by replay).
        """
        reward, finish_reason, attempt = (
            outcome.get("reward"),
            outcome.get("finish_reason"),
            outcome.get("attempt"),
        )
        if status not in TERMINAL_STATUSES:
            raise InvalidRecordError(f"status must be one of {TERMINAL_STATUSES}, got {status!r}")
        if reward is not None and (not isinstance(reward, int | float) or not math.isfinite(reward)):
            raise InvalidRecordError(f"reward must be a finite number, got {reward!r}")
        check_text(finish_reason, what="finish_reason", max_chars=64)
        error = redact(outcome.get("error"), self.db.secrets)
        if error is not None:
            error = error.replace("\x00", "")[:8192]
        info = dict(outcome.get("info") or {})
        r = self.runs.by_id(self.get(session_id).run_id)
        payload = {
            "status": status,
            "reward": reward,
            "finish_reason": finish_reason,
            "error": error,
            "info": info,
        }

        def tx(conn: Connection) -> None:
            current = conn.execute(  # the session row first, then the counter (as the turn append)
                select(t.sessions.c.status, t.sessions.c.reward, t.sessions.c.attempt, t.sessions.c.info)
                .where(t.sessions.c.id == session_id)
                .with_for_update()
            ).one()
            if attempt is not None and current.status == "running" and current.attempt != attempt:
                raise LeaseError(
                    f"session {session_id} was taken over by attempt {current.attempt}; "
                    f"attempt {attempt} cannot finalize it"
                )
            if current.status in TERMINAL_STATUSES:
                if current.status == status and current.reward == reward:
                    return
                raise IdempotencyConflictError(
                    f"session {session_id} is already {current.status} (reward {current.reward}); "
                    f"cannot finalize it as {status} (reward {reward})"
                )
            key = deterministic_key(r.name, session_id, "final")
            self.db.append_event_tx(conn, r.id, "session_finalized", payload, key=key, session_id=session_id)
            values: dict[str, object] = {
                "status": status,
                "reward": reward,
                "finish_reason": finish_reason,
                "error": error,
                "finished_at": time.time(),
            }
            if info:
                kept = {
                    k: v
                    for k, v in (current.info or {}).items()
                    if k in KEPT_INFO and (k == "resume" or k not in info)
                }
                values["info"] = {**info, **kept}
            conn.execute(update(t.sessions).where(t.sessions.c.id == session_id).values(**values))

        self.db.retrying(tx)
        return self.get(session_id)

    def get(self, session_id: str) -> Session:
        """The session ``session_id``; raises :class:`UnknownSessionError` when absent."""
        with self.db.read() as conn:
            row = conn.execute(select(t.sessions).where(t.sessions.c.id == session_id)).first()
        if row is None:
            raise UnknownSessionError(f"no session {session_id!r} in the log")
        return _session(row)

    def head(self, session_id: str) -> SessionHead:
        """Status, turns recorded and attempt of a session: one indexed read, so a proxy can check its
        cache.

        The turn count is ``max(turn_index) + 1`` (0 without turns). Several proxies serve one
        session from one log; a proxy whose cached state is behind this count, or of an earlier
        attempt (the session was taken over), rebuilds it.
        """
        return read_session_head(self.db, session_id)

    async def head_async(self, session_id: str) -> SessionHead:
        """:meth:`head` for event loops (the proxy, per request); on PostgreSQL one prepared
        statement on the loop's async connections."""
        return await self._appender.session_head_async(session_id)

    def by_token(self, token: str) -> Session | None:
        """The session bound to bearer ``token`` (looked up by its sha256), or None."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self.db.read() as conn:
            row = conn.execute(select(t.sessions).where(t.sessions.c.token_sha256 == digest)).first()
        return _session(row) if row is not None else None

    def list(self, run: str | Run, *, status: str | None = None) -> list[Session]:
        """Sessions of a run, oldest first, optionally with one ``status``."""
        r = self.runs.get(run)
        if status is not None and status not in SESSION_STATUSES:
            raise InvalidRecordError(f"status must be one of {SESSION_STATUSES}")
        q = select(t.sessions).where(t.sessions.c.run_id == r.id)
        if status:
            q = q.where(t.sessions.c.status == status)
        with self.db.read() as conn:
            rows = conn.execute(q.order_by(t.sessions.c.created_at, t.sessions.c.id)).all()
        return [_session(x) for x in rows]

    def rewards_by_version(
        self, run: str | Run, kind: str = "train"
    ) -> builtins.list[tuple[int, float, int]]:
        """``(policy version, mean reward, sessions)`` of the run's finished sessions of ``kind``.

        ``train``: sessions of training tasks (or of no task) by the newest policy version that
        generated their tokens; ``eval``: eval sessions by the version they evaluate. Apart,
        because eval sessions are never trained (a mix matches neither curve).
        """
        r = self.runs.get(run)
        s, k, u = t.sessions.c, t.tasks.c, t.turns.c
        done = (s.run_id == r.id, s.status == "finished", s.reward.is_not(None))
        if kind == "eval":
            stmt = (
                select(k.eval_version, func.avg(s.reward), func.count())
                .select_from(t.sessions.join(t.tasks, k.id == s.task_id))
                .where(*done, k.kind == "eval", k.eval_version.is_not(None))
                .group_by(k.eval_version)
                .order_by(k.eval_version)
            )
        elif kind == "train":
            per_session = (
                select(s.id, s.reward, func.max(u.max_policy_version).label("version"))
                .select_from(
                    t.sessions.join(t.turns, u.session_id == s.id).outerjoin(t.tasks, k.id == s.task_id)
                )
                .where(*done, func.coalesce(k.kind, "train") == "train")
                .group_by(s.id, s.reward)
                .subquery()
            )
            v = per_session.c
            stmt = (
                select(v.version, func.avg(v.reward), func.count())
                .where(v.version.is_not(None))
                .group_by(v.version)
                .order_by(v.version)
            )
        else:
            raise InvalidRecordError(f"kind must be 'train' or 'eval', got {kind!r}")
        with self.db.read() as conn:
            return [(int(x), float(m), int(n)) for x, m, n in conn.execute(stmt).all()]

    def children(self, session_id: str) -> builtins.list[Session]:
        """The forks of session ``session_id`` (sessions whose parent it is), oldest first."""
        c = t.sessions.c
        with self.db.read() as conn:
            rows = conn.execute(
                select(t.sessions).where(c.parent_session_id == session_id).order_by(c.created_at, c.id)
            ).all()
        return [_session(x) for x in rows]

    def tree(self, session_id: str) -> builtins.list[Session]:
        """Every session of ``session_id``'s fork tree, its root first, each parent before its
        children (depth first). A session whose parent is no longer in the log is a root."""
        root = self.get(session_id)
        seen = {root.id}
        while root.parent_session_id is not None and root.parent_session_id not in seen:
            try:
                root = self.get(root.parent_session_id)
            except UnknownSessionError:
                break
            seen.add(root.id)
        out: builtins.list[Session] = []
        stack = [root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(self.children(node.id)))
        return out

    def has_finished(self, task_id: int) -> bool:
        """True when the (task, sample) queue entry ``task_id`` already has a finished session."""
        c = t.sessions.c
        with self.db.read() as conn:
            q = select(c.id).where(c.task_id == task_id, c.status == "finished").limit(1)
            return conn.execute(q).first() is not None

    def finished_session(self, task_id: int) -> Session | None:
        """The finished session of the (task, sample) queue entry ``task_id`` (a tree's root), or None."""
        c = t.sessions.c
        with self.db.read() as conn:
            q = select(c.id).where(c.task_id == task_id, c.status == "finished").order_by(c.created_at)
            sid = conn.execute(q.limit(1)).scalar_one_or_none()
        return self.get(str(sid)) if sid is not None else None

    def interrupted(self, task_id: int, attempt: int) -> Session | None:
        """The still-running session of an earlier attempt of task ``task_id``, or None.

        That is the session a worker that died (or lost its lease) left behind, kept running by a
        resuming claim; the latest one when there are several.
        """
        c = t.sessions.c
        with self.db.read() as conn:
            sid = conn.execute(
                select(c.id)
                .where(c.task_id == task_id, c.status == "running", c.attempt < attempt)
                .order_by(c.attempt.desc(), c.created_at.desc())
                .limit(1)
            ).scalar_one_or_none()
        return self.get(str(sid)) if sid is not None else None

    def take_over(
        self, session_id: str, *, attempt: int, token: str, info: Mapping[str, Any] | None = None
    ) -> Session:
        """Hand a running session over to ``attempt`` with bearer ``token``; records ``session_resumed``.

        Raises :class:`LeaseError` when the session is no longer running (finished or abandoned
        meanwhile) or already belongs to ``attempt`` or a later one. The old token stops working.
        ``info`` is where the new attempt runs (a Ray worker's ``ray_node_id``, ``ray_node_ip``,
        ``worker``): it joins the session's info at once (a session whose taker dies before it
        finalizes does not name the node that died) and the resume record (``info.resume.info``,
        and the event), which a finalize keeps: every takeover says where it ran.
        """
        if attempt < 1:
            raise InvalidRecordError(f"attempt must be >= 1, got {attempt}")
        taker = dict(info or {})
        canonical_json(taker, what="takeover info", max_bytes=self.db.max_payload_bytes)
        digest = hashlib.sha256(token.encode()).hexdigest()
        self.db.retrying(lambda conn: self._take_over_tx(conn, session_id, attempt, digest, taker))
        return self.get(session_id)

    def _take_over_tx(
        self, conn: Connection, session_id: str, attempt: int, token_sha: str, taker: dict[str, Any]
    ) -> None:
        row = conn.execute(select(t.sessions).where(t.sessions.c.id == session_id).with_for_update()).first()
        if row is None:
            raise LeaseError(f"no session {session_id!r} to resume")
        if row.status != "running" or row.attempt >= attempt:
            raise LeaseError(
                f"session {session_id} is {row.status} at attempt {row.attempt}; attempt {attempt} cannot resume it"
            )
        next_turn = conn.execute(
            select(func.coalesce(func.max(t.turns.c.turn_index) + 1, 0)).where(
                t.turns.c.run_id == row.run_id, t.turns.c.session_id == session_id
            )
        ).scalar_one()
        info: dict[str, Any] = dict(row.info or {})
        before = info.get("resume") or {}
        record: dict[str, Any] = {
            "attempt": attempt,
            "from_attempt": int(row.attempt),
            "seed_attempt": int(before.get("seed_attempt", row.attempt)),
            "next_turn": int(next_turn),
            "count": int(before.get("count", 0)) + 1,
        }
        if taker:
            record["info"] = taker
        run = self.runs.by_id(row.run_id)
        key = deterministic_key(run.name, session_id, "resume", attempt)
        self.db.append_event_tx(conn, row.run_id, "session_resumed", record, key=key, session_id=session_id)
        conn.execute(
            update(t.sessions)
            .where(t.sessions.c.id == session_id)
            .values(attempt=attempt, token_sha256=token_sha, info={**info, **taker, "resume": record})
        )


KEPT_INFO = ("resume", "start")
"""Keys of a session's ``info`` a finalize keeps: its takeovers and how it started."""


def seed_attempt(session: Session) -> int:
    """The attempt whose sampling seed ``session`` uses (its first one, across takeovers)."""
    resume = session.info.get("resume") if isinstance(session.info, dict) else None
    if isinstance(resume, dict) and isinstance(resume.get("seed_attempt"), int):
        return int(resume["seed_attempt"])
    return session.attempt


def _session(row: Row[Any]) -> Session:
    return Session(
        id=row.id,
        run_id=row.run_id,
        task_id=row.task_id,
        attempt=row.attempt,
        agent=row.agent,
        sandbox=row.sandbox,
        status=row.status,
        reward=row.reward,
        finish_reason=row.finish_reason,
        error=row.error,
        info=row.info or {},
        created_at=row.created_at,
        finished_at=row.finished_at,
        parent_session_id=row.parent_session_id,
        fork_turn=row.fork_turn,
    )
