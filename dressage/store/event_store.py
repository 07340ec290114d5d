"""The event log's Python API: runs, events, sessions and turns.

Every write is one transaction. Positions are dense and commit-ordered per run: each append takes
the next position from the run's counter row (``UPDATE ... RETURNING``) inside its transaction, so
the row lock orders commits and a tailer that reads ``position > p`` never misses an event.
Appends are idempotent by key: a retry after an ambiguous commit returns the stored position, the
same key with different content raises :class:`IdempotencyConflictError`.

Turns (the hot append and read paths), task leases, session takeover on resume, consumer
checkpoints and artifacts live in mixins (``turn_log``, ``leases``, ``resume``, ``consumers``,
``artifact_log``) that share this class's connection handling.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from dressage.config import Settings, load_settings
from dressage.errors import (
    IdempotencyConflictError,
    InvalidRecordError,
    LeaseError,
    StoreError,
    UnknownRunError,
    UnknownSessionError,
)
from dressage.redact import db_error_text, redact
from dressage.store import schema as t
from dressage.store.artifact_log import ArtifactLogMixin
from dressage.store.artifacts import BlobStore, LocalBlobStore
from dressage.store.consumers import ConsumerMixin
from dressage.store.db import READONLY_OPTION, ensure_schema, make_engine
from dressage.store.leases import LeaseMixin
from dressage.store.records import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    SESSION_STATUSES,
    TERMINAL_STATUSES,
    AppendResult,
    Event,
    Run,
    Session,
    SessionHead,
    canonical_json,
    check_duplicate,
    check_text,
    deterministic_key,
)
from dressage.store.resume import ResumeMixin
from dressage.store.turn_io import (
    AsyncPgAppenderPool,
    PgTurnAppender,
)
from dressage.store.turn_log import TurnLogMixin


class EventStore(TurnLogMixin, LeaseMixin, ResumeMixin, ConsumerMixin, ArtifactLogMixin):
    """Typed access to the event log on SQLite or PostgreSQL.

    Build it with :meth:`open` (from settings or a URL) or directly from an engine. Run arguments
    accept a run name or a :class:`Run`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        blobs: BlobStore | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.blobs = blobs
        self.max_payload_bytes = max_payload_bytes
        self.secrets = secrets
        self._runs: dict[str, Run] = {}
        self._local = threading.local()
        self._appenders: list[PgTurnAppender] = []
        self._appenders_lock = threading.Lock()
        self._async_appenders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncPgAppenderPool] = (
            weakref.WeakKeyDictionary()
        )
        self._writer: ThreadPoolExecutor | None = None

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        auto_upgrade: bool = True,
        pool_size: int = 5,
    ) -> EventStore:
        """Open the log at ``url`` (default: from settings), upgrading the schema if allowed."""
        settings = settings or load_settings()
        engine = make_engine(url or settings.resolved_database_url(), pool_size=pool_size)
        try:
            ensure_schema(engine, auto_upgrade=auto_upgrade)
        except OperationalError as e:
            raise StoreError(f"cannot reach the database {engine.url!r}: {e.orig}; is it running?") from e
        return cls(
            engine,
            blobs=LocalBlobStore(settings.resolved_artifacts_dir()),
            max_payload_bytes=settings.max_payload_bytes,
            secrets=tuple(s.get_secret_value() for s in settings.secrets),
        )

    @property
    def dialect(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Release pooled connections."""
        with self._appenders_lock:
            for appender in self._appenders:
                appender.reset()
            self._appenders.clear()
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
        self.engine.dispose()

    # --- connections ------------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction; SQLAlchemy errors are translated to :class:`StoreError`."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise  # the callers decide: a lost race on a unique key, or bad input
        except SQLAlchemyError as e:
            raise StoreError(f"database write failed: {db_error_text(e, self.secrets)}") from e

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A read: autocommit statements on PostgreSQL (no BEGIN/COMMIT round trips), a deferred
        transaction on SQLite (no write lock)."""
        try:
            with self.engine.connect() as conn:
                if self.dialect == "postgresql":
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                    yield conn
                else:
                    conn.execution_options(**{READONLY_OPTION: True})
                    with conn.begin():
                        yield conn
        except SQLAlchemyError as e:
            raise StoreError(f"database read failed: {db_error_text(e, self.secrets)}") from e

    # --- runs -------------------------------------------------------------------------------------

    def create_run(
        self, name: str, config: Mapping[str, Any] | None = None, *, must_match: bool = True
    ) -> Run:
        """Create run ``name`` with a frozen config snapshot, or continue it if it exists.

        When the run exists and ``must_match`` is set, its stored config must equal ``config``
        (a frozen snapshot cannot change under a resumed run).
        """
        check_text(name, what="run name", max_chars=200)
        if not name.strip():
            raise InvalidRecordError("run name must not be empty")
        config = dict(config or {})
        data = canonical_json(config, what=f"config of run {name!r}", max_bytes=self.max_payload_bytes)
        config_hash = hashlib.sha256(data).hexdigest()
        existing = self._load_run(name)
        if existing is None:
            try:
                with self._write() as conn:
                    now = time.time()
                    run_id = conn.execute(
                        insert(t.runs)
                        .values(name=name, config=config, config_hash=config_hash, created_at=now)
                        .returning(t.runs.c.id)
                    ).scalar_one()
                    conn.execute(insert(t.run_counters).values(run_id=run_id, last_position=0))
                    self._append_event_tx(
                        conn,
                        run_id,
                        "run_created",
                        {"name": name, "config_hash": config_hash},
                        key="run_created",
                    )
            except IntegrityError:
                pass  # another process created it first; fall through to the comparison
            existing = self._load_run(name)
            assert existing is not None
        if must_match and existing.config_hash != config_hash and config:
            raise InvalidRecordError(
                f"run {name!r} exists with a different config (hash {existing.config_hash[:12]}, "
                f"given {config_hash[:12]}); resume it without a config or choose a new run name"
            )
        return existing

    def get_run(self, run: str | Run) -> Run:
        """The run called ``run``; raises :class:`UnknownRunError` when the log has none."""
        if isinstance(run, Run):
            return run
        found = self._runs.get(run) or self._load_run(run)
        if found is None:
            raise UnknownRunError(f"no run named {run!r} in the log; list runs with `dressage-worker runs`")
        return found

    def list_runs(self) -> list[Run]:
        """Every run, oldest first."""
        with self._read() as conn:
            rows = conn.execute(select(t.runs).order_by(t.runs.c.id)).all()
        return [Run(r.id, r.name, r.config, r.config_hash, r.created_at) for r in rows]

    def _load_run(self, name: str) -> Run | None:
        with self._read() as conn:
            r = conn.execute(select(t.runs).where(t.runs.c.name == name)).first()
        if r is None:
            return None
        run = Run(r.id, r.name, r.config, r.config_hash, r.created_at)
        self._runs[name] = run
        return run

    def drop_run(self, run: str | Run) -> None:
        """Delete every row of a run (artifact blobs stay: they are content-addressed and may be shared)."""
        r = self.get_run(run)
        with self._write() as conn:
            for table in (
                t.turns,
                t.artifacts,
                t.events,
                t.sessions,
                t.tasks,
                t.policy_versions,
                t.consumer_checkpoints,
                t.train_steps,
                t.run_counters,
            ):
                conn.execute(delete(table).where(table.c.run_id == r.id))
            conn.execute(delete(t.runs).where(t.runs.c.id == r.id))
        self._runs.pop(r.name, None)

    # --- events -----------------------------------------------------------------------------------

    def _next_position(self, conn: Connection, run_id: int) -> int:
        """Take the next dense position; the counter row's lock orders concurrent appends."""
        pos = conn.execute(
            update(t.run_counters)
            .where(t.run_counters.c.run_id == run_id)
            .values(last_position=t.run_counters.c.last_position + 1)
            .returning(t.run_counters.c.last_position)
        ).scalar_one_or_none()
        if pos is None:
            raise UnknownRunError(f"run id {run_id} has no position counter; was it dropped?")
        return int(pos)

    def _append_event_tx(
        self,
        conn: Connection,
        run_id: int,
        kind: str,
        payload: Mapping[str, Any],
        *,
        key: str | None = None,
        session_id: str | None = None,
        content_hash: str | None = None,
    ) -> AppendResult:
        """Append one event inside an open transaction (idempotent by ``key``)."""
        data = canonical_json(dict(payload), what=f"{kind} event payload", max_bytes=self.max_payload_bytes)
        if content_hash is None:
            h = hashlib.sha256(kind.encode() + b"\x00" + (session_id or "").encode() + b"\x00" + data)
            content_hash = h.hexdigest()
        key = key or str(uuid.uuid4())
        existing = conn.execute(
            select(t.events.c.position, t.events.c.content_hash).where(
                t.events.c.run_id == run_id, t.events.c.idem_key == key
            )
        ).first()
        if existing is not None:
            return check_duplicate(existing.position, existing.content_hash, key, content_hash)
        position = self._next_position(conn, run_id)
        conn.execute(
            insert(t.events).values(
                run_id=run_id,
                position=position,
                kind=kind,
                session_id=session_id,
                idem_key=key,
                content_hash=content_hash,
                payload=dict(payload),
                created_at=time.time(),
            )
        )
        return AppendResult(position=position, key=key, duplicate=False)

    def append_event(
        self,
        run: str | Run,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        session_id: str | None = None,
    ) -> AppendResult:
        """Append an event of ``kind``; with a ``key`` a retry returns the stored position."""
        check_text(kind, what="event kind", max_chars=64)
        r = self.get_run(run)
        return self._retrying(
            lambda conn: self._append_event_tx(
                conn, r.id, kind, payload or {}, key=key, session_id=session_id
            )
        )

    def _retrying(self, fn: Any, attempts: int = 3) -> Any:
        """Run ``fn(conn)`` in a write transaction; retry when a concurrent writer won a unique race."""
        for i in range(attempts):
            try:
                with self._write() as conn:
                    return fn(conn)
            except IntegrityError as e:
                if i == attempts - 1:
                    raise InvalidRecordError(
                        f"the log refused the record: {db_error_text(e, self.secrets)}"
                    ) from e
        raise AssertionError("unreachable")

    def read_events(
        self, run: str | Run, after: int = 0, limit: int = 1000, kinds: tuple[str, ...] = ()
    ) -> list[Event]:
        """Events with ``position > after`` in position order (at most ``limit``)."""
        r = self.get_run(run)
        q = select(t.events).where(t.events.c.run_id == r.id, t.events.c.position > after)
        if kinds:
            q = q.where(t.events.c.kind.in_(kinds))
        with self._read() as conn:
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

    def tail_events(
        self, run: str | Run, after: int = 0, *, follow: bool = False, poll_s: float = 0.2, batch: int = 1000
    ) -> Iterator[Event]:
        """Yield events after ``after`` in order; with ``follow``, keep polling for new ones."""
        while True:
            events = self.read_events(run, after, batch)
            yield from events
            if events:
                after = events[-1].position
                continue
            if not follow:
                return
            time.sleep(poll_s)

    def last_position(self, run: str | Run) -> int:
        """The position of the run's newest event (0 when empty)."""
        r = self.get_run(run)
        with self._read() as conn:
            pos = conn.execute(
                select(t.run_counters.c.last_position).where(t.run_counters.c.run_id == r.id)
            ).scalar_one_or_none()
        return int(pos or 0)

    # --- sessions ---------------------------------------------------------------------------------

    def open_session(
        self,
        run: str | Run,
        *,
        session_id: str | None = None,
        task_id: int | None = None,
        attempt: int = 1,
        agent: str | None = None,
        sandbox: str | None = None,
        token: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Session:
        """Start a session (trajectory); idempotent for an explicit ``session_id``."""
        r = self.get_run(run)
        sid = session_id or uuid.uuid4().hex
        check_text(sid, what="session_id", max_chars=64)
        for name, value in (("agent", agent), ("sandbox", sandbox)):
            check_text(value, what=name, max_chars=200)
        info = dict(info or {})
        canonical_json(info, what="session info", max_bytes=self.max_payload_bytes)
        token_sha = hashlib.sha256(token.encode()).hexdigest() if token else None
        payload = {"task_id": task_id, "attempt": attempt, "agent": agent, "sandbox": sandbox, "info": info}

        def tx(conn: Connection) -> None:
            res = self._append_event_tx(
                conn,
                r.id,
                "session_started",
                payload,
                key=deterministic_key(r.name, sid, "start"),
                session_id=sid,
            )
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
                )
            )

        self._retrying(tx)
        return self.get_session(sid)

    def finalize_session(
        self,
        session_id: str,
        status: str,
        *,
        reward: float | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
        info: Mapping[str, Any] | None = None,
        attempt: int | None = None,
    ) -> Session:
        """Move a running session to a terminal status with its reward, atomically and idempotently.

        Finalizing again with the same status and reward returns the session unchanged; a different
        outcome for a session that is already terminal raises :class:`IdempotencyConflictError`.
        With ``attempt``, a running session that another attempt has taken over (resumed, see
        :mod:`dressage.store.resume`) is not finalized: :class:`LeaseError`. ``info`` replaces the
        session's info but keeps its ``resume`` record.
        """
        if status not in TERMINAL_STATUSES:
            raise InvalidRecordError(f"status must be one of {TERMINAL_STATUSES}, got {status!r}")
        if reward is not None and (not isinstance(reward, int | float) or not math.isfinite(reward)):
            raise InvalidRecordError(f"reward must be a finite number, got {reward!r}")
        check_text(finish_reason, what="finish_reason", max_chars=64)
        error = redact(error, self.secrets)
        if error is not None:
            error = error.replace("\x00", "")[:8192]
        info = dict(info or {})
        session = self.get_session(session_id)
        r = self.get_run_by_id(session.run_id)
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
            self._append_event_tx(
                conn,
                r.id,
                "session_finalized",
                payload,
                key=deterministic_key(r.name, session_id, "final"),
                session_id=session_id,
            )
            values: dict[str, Any] = {
                "status": status,
                "reward": reward,
                "finish_reason": finish_reason,
                "error": error,
                "finished_at": time.time(),
            }
            if info:
                resume = (current.info or {}).get("resume")
                values["info"] = {**info, "resume": resume} if resume is not None else info
            conn.execute(update(t.sessions).where(t.sessions.c.id == session_id).values(**values))

        self._retrying(tx)
        return self.get_session(session_id)

    def get_run_by_id(self, run_id: int) -> Run:
        """The run with database id ``run_id``."""
        for run in self._runs.values():
            if run.id == run_id:
                return run
        with self._read() as conn:
            name = conn.execute(select(t.runs.c.name).where(t.runs.c.id == run_id)).scalar_one_or_none()
        if name is None:
            raise UnknownRunError(f"no run with id {run_id}")
        return self.get_run(name)

    def get_session(self, session_id: str) -> Session:
        """The session ``session_id``; raises :class:`UnknownSessionError` when absent."""
        with self._read() as conn:
            row = conn.execute(select(t.sessions).where(t.sessions.c.id == session_id)).first()
        if row is None:
            raise UnknownSessionError(f"no session {session_id!r} in the log")
        return _session(row)

    def session_head(self, session_id: str) -> SessionHead:
        """Status, turns recorded and attempt of a session: one indexed read, so a proxy can check its
        cache.

        The turn count is ``max(turn_index) + 1`` (0 without turns). Several proxies serve one
        session from one log; a proxy whose cached state is behind this count, or of an earlier
        attempt (the session was taken over by in-flight resume), rebuilds it.
        """
        last = (
            select(func.max(t.turns.c.turn_index)).where(t.turns.c.session_id == session_id).scalar_subquery()
        )
        with self._read() as conn:
            row = conn.execute(
                select(t.sessions.c.status, last, t.sessions.c.attempt).where(t.sessions.c.id == session_id)
            ).first()
        if row is None:
            raise UnknownSessionError(f"no session {session_id!r} in the log")
        return SessionHead(str(row[0]), 0 if row[1] is None else int(row[1]) + 1, int(row[2]))

    def session_by_token(self, token: str) -> Session | None:
        """The session bound to bearer ``token`` (looked up by its sha256), or None."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._read() as conn:
            row = conn.execute(select(t.sessions).where(t.sessions.c.token_sha256 == digest)).first()
        return _session(row) if row is not None else None

    def list_sessions(self, run: str | Run, *, status: str | None = None) -> list[Session]:
        """Sessions of a run, oldest first, optionally with one ``status``."""
        r = self.get_run(run)
        if status is not None and status not in SESSION_STATUSES:
            raise InvalidRecordError(f"status must be one of {SESSION_STATUSES}")
        q = select(t.sessions).where(t.sessions.c.run_id == r.id)
        if status:
            q = q.where(t.sessions.c.status == status)
        with self._read() as conn:
            rows = conn.execute(q.order_by(t.sessions.c.created_at, t.sessions.c.id)).all()
        return [_session(x) for x in rows]

    def run_summary(self, run: str | Run) -> dict[str, Any]:
        """Counts for the ``runs`` table: sessions by status, turns, tokens, mean reward (of the
        finished sessions of training tasks: eval sessions are reported per policy version)."""
        r = self.get_run(run)
        with self._read() as conn:
            by_status: dict[str, int] = dict(
                conn.execute(
                    select(t.sessions.c.status, func.count())
                    .where(t.sessions.c.run_id == r.id)
                    .group_by(t.sessions.c.status)
                ).all()
            )
            turns_row = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(t.turns.c.n_context + t.turns.c.n_generated), 0),
                    func.coalesce(func.sum(t.turns.c.n_trained), 0),
                ).where(t.turns.c.run_id == r.id)
            ).one()
            mean_reward = conn.execute(
                select(func.avg(t.sessions.c.reward))
                .select_from(t.sessions.outerjoin(t.tasks, t.tasks.c.id == t.sessions.c.task_id))
                .where(
                    and_(t.sessions.c.run_id == r.id, t.sessions.c.status == "finished"),
                    or_(t.tasks.c.kind.is_(None), t.tasks.c.kind == "train"),
                )
            ).scalar_one()
        return {
            "run": r.name,
            "sessions": {k: int(v) for k, v in by_status.items()},
            "turns": int(turns_row[0]),
            "tokens": int(turns_row[1]),
            "trained_tokens": int(turns_row[2]),
            "mean_reward": float(mean_reward) if mean_reward is not None else None,
            "last_position": self.last_position(r),
        }


def _session(row: Any) -> Session:
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
    )
