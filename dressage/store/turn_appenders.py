"""The durable turn append, one implementation per backend behind one :class:`TurnAppender` interface.

A turn append writes the turn row and its ``turn`` event in one transaction, before the agent sees
the reply. Both backends follow the same rules, checked on the same prepared turn (see
:func:`~dressage.store.records.prepare_turn`): a re-sent key returns the stored position (or
raises when its content differs), the session must exist in the run and be running, a turn index
is recorded once per session. :class:`SqliteTurnAppender` applies them in Python inside a
write transaction; :class:`PostgresTurnAppender` runs them as one statement (a CTE, see
:mod:`dressage.store.turn_io`) and, when that statement records nothing, asks a second one why.
:class:`~dressage.store.database.Database` picks the appender once, by its dialect.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import psycopg
from sqlalchemy import Connection, insert, select
from sqlalchemy.exc import IntegrityError

from dressage.errors import (
    InvalidRecordError,
    StoreError,
    TurnIndexTakenError,
    UnknownRunError,
    UnknownSessionError,
)
from dressage.redact import db_error_text
from dressage.store import schema as t
from dressage.store.database import Database, integrity_refusal
from dressage.store.pg_group_append import GroupAppender, GroupAppendItem
from dressage.store.records import AppendResult, PreparedTurn, Run, SessionHead, check_duplicate
from dressage.store.sessions import read_session_head
from dressage.store.turn_io import (
    KEY_CONSTRAINT,
    TURN_INDEX_CONSTRAINT,
    AsyncPgAppenderPool,
    PgTurnAppender,
    pg_append_values,
)

PG_APPEND_ATTEMPTS = 3
"""How often a PostgreSQL append is tried (a lost unique-key race, a broken connection)."""


class TurnAppender(Protocol):
    """How one backend appends a prepared turn (sync and from an event loop) and serves the
    per-request session head the proxy reads."""

    def append(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """Record ``prep`` durably, or return the stored append of its key."""
        ...

    async def append_async(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """:meth:`append` for event loops."""
        ...

    async def session_head_async(self, session_id: str) -> SessionHead:
        """The session's status, turn count and attempt, for event loops."""
        ...

    async def aclose_async(self) -> None:
        """Close what the running event loop opened."""
        ...

    def close(self) -> None:
        """Close every connection and thread the appender holds."""
        ...


def make_turn_appender(db: Database) -> TurnAppender:
    """The appender of ``db``'s backend."""
    if db.dialect == "postgresql":
        return PostgresTurnAppender(db)
    return SqliteTurnAppender(db)


def turn_index_taken(prep: PreparedTurn) -> TurnIndexTakenError:
    """The error for a turn whose index its session already recorded under another key."""
    return TurnIndexTakenError(
        f"session {prep.row['session_id']} already has a turn {prep.row['turn_index']} recorded under "
        f"another key than {prep.key}; a turn index is recorded once per session"
    )


def check_session(session_id: str, run: Run, status: str | None, session_run_id: int | None) -> None:
    """Raise the right error when a turn cannot go into ``session_id``."""
    if status is None:
        raise UnknownSessionError(f"no session {session_id!r}; open it before appending turns")
    if session_run_id != run.id:
        raise InvalidRecordError(f"session {session_id} belongs to another run than {run.name!r}")
    if status != "running":
        raise InvalidRecordError(f"session {session_id} is {status}; no more turns can be recorded")


class SqliteTurnAppender:
    """SQLite: the append rules in Python inside one write transaction; async appends run on one
    dedicated writer thread (SQLite writes serialise anyway)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._writer: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def append(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """Record ``prep`` in one write transaction (retried when a concurrent writer won a race)."""
        return self.db.retrying(lambda conn: self._append_tx(conn, run, prep))

    def _append_tx(self, conn: Connection, r: Run, prep: PreparedTurn) -> AppendResult:
        existing = conn.execute(
            select(t.events.c.position, t.events.c.content_hash).where(
                t.events.c.run_id == r.id, t.events.c.idem_key == prep.key
            )
        ).first()
        if existing is not None:
            return check_duplicate(existing.position, existing.content_hash, prep.key, prep.content_hash)
        session_id = str(prep.row["session_id"])
        session = conn.execute(
            select(t.sessions.c.status, t.sessions.c.run_id).where(t.sessions.c.id == session_id)
        ).first()
        check_session(session_id, r, session.status if session else None, session.run_id if session else None)
        position = self.db.next_position(conn, r.id)
        now = time.time()
        conn.execute(
            insert(t.events).values(
                run_id=r.id,
                position=position,
                kind="turn",
                session_id=session_id,
                idem_key=prep.key,
                content_hash=prep.content_hash,
                payload=prep.event_payload,
                created_at=now,
            )
        )
        try:  # an error rolls the whole transaction back, the event row too
            conn.execute(
                insert(t.turns).values(
                    **prep.row_with_lists(), run_id=r.id, position=position, created_at=now
                )
            )
        except IntegrityError as e:
            if "turns.session_id, turns.turn_index" in str(e.orig):
                raise turn_index_taken(prep) from e
            raise
        return AppendResult(position=position, key=prep.key, duplicate=False)

    async def append_async(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """:meth:`append` on the writer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._writer_thread(), self.append, run, prep)

    async def session_head_async(self, session_id: str) -> SessionHead:
        """The session head, read on a worker thread."""
        return await asyncio.to_thread(read_session_head, self.db, session_id)

    async def aclose_async(self) -> None:
        """Nothing is bound to an event loop on SQLite."""

    def _writer_thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="dressage-writer")
            return self._writer

    def close(self) -> None:
        """Stop the writer thread."""
        with self._lock:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None


class PostgresTurnAppender:
    """PostgreSQL: the whole durable append is one autocommit statement (see turn_io).

    It runs on a per-thread psycopg connection outside the SQLAlchemy pool (no pool pre-ping, no
    BEGIN/COMMIT round trips, a server-side prepared statement), or from an event loop on a small
    pool of async connections owned by that loop. When it records nothing, a second statement says
    why (a re-sent key, a closed session). A broken connection is replaced and the append retried;
    the idempotency key makes that safe.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._local = threading.local()
        self._appenders: list[PgTurnAppender] = []
        self._lock = threading.Lock()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncPgAppenderPool] = (
            weakref.WeakKeyDictionary()
        )
        self._groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupAppender] = (
            weakref.WeakKeyDictionary()
        )

    def append(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """Record ``prep`` with one statement on this thread's connection."""
        values = pg_append_values(prep, run.id, time.time())
        for attempt in range(PG_APPEND_ATTEMPTS):
            appender = self._thread_appender()
            try:
                try:
                    position = appender.append(values)
                except psycopg.errors.UniqueViolation as e:
                    _check_refusal(e, prep)
                    position = None  # the key is taken: the diagnosis finds the stored append
                if position is not None:
                    return AppendResult(position=position, key=prep.key, duplicate=False)
                result = _outcome(appender.diagnose(values), run, prep)
            except psycopg.Error as e:
                if isinstance(e, psycopg.OperationalError):
                    appender.reset()
                self._retry_or_raise(e, attempt)
                continue
            if result is not None:
                return result
        raise StoreError(
            f"turn {prep.key} was not recorded after {PG_APPEND_ATTEMPTS} attempts; retry the append"
        )

    async def append_async(self, run: Run, prep: PreparedTurn) -> AppendResult:
        """Record ``prep`` on the running loop's async connections, without a thread hop.

        While another append of this loop is being written, ``prep`` joins the next group
        (:mod:`dressage.store.pg_group_append`: one transaction and one flush for the turns that
        arrive together); otherwise, or when its group recorded nothing, it is written alone.
        """
        values = pg_append_values(prep, run.id, time.time())
        group = self.group_appender()
        if group.writing:
            position = await group.join(run.id, str(prep.row["session_id"]), values)
            if position is not None:
                return AppendResult(position=position, key=prep.key, duplicate=False)
        async with group.alone():
            return await self._append_alone(run, prep, values)

    async def _append_alone(self, run: Run, prep: PreparedTurn, values: list[bytes | None]) -> AppendResult:
        """One autocommit statement; when it records nothing, a second one says why."""
        pool = self._pool()
        for attempt in range(PG_APPEND_ATTEMPTS):
            async with pool.appender() as appender:
                try:
                    try:
                        position = await appender.append(values)
                    except psycopg.errors.UniqueViolation as e:
                        _check_refusal(e, prep)
                        position = None
                    if position is not None:
                        return AppendResult(position=position, key=prep.key, duplicate=False)
                    result = _outcome(await appender.diagnose(values), run, prep)
                except psycopg.Error as e:
                    if isinstance(e, psycopg.OperationalError):
                        await appender.reset()
                    self._retry_or_raise(e, attempt)
                    continue
            if result is not None:
                return result
        raise StoreError(
            f"turn {prep.key} was not recorded after {PG_APPEND_ATTEMPTS} attempts; retry the append"
        )

    async def session_head_async(self, session_id: str) -> SessionHead:
        """One prepared statement on the loop's async connections; a broken connection is replaced
        and the read tried once more."""
        pool = self._pool()
        for attempt in range(2):
            async with pool.appender() as appender:
                try:
                    row = await appender.session_head(session_id)
                except psycopg.OperationalError as e:
                    await appender.reset()
                    if attempt:
                        raise StoreError(
                            f"database read failed: {db_error_text(e, self.db.secrets)}; is PostgreSQL up?"
                        ) from e
                    continue
                except psycopg.Error as e:
                    raise StoreError(f"database read failed: {db_error_text(e, self.db.secrets)}") from e
            if row is None:
                raise UnknownSessionError(f"no session {session_id!r} in the log")
            return SessionHead(str(row[0]), 0 if row[1] is None else int(row[1]) + 1, int(row[2]))
        raise AssertionError("unreachable")

    async def aclose_async(self) -> None:
        """Close the async connections the running loop opened."""
        self._groups.pop(asyncio.get_running_loop(), None)
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for appender in self._appenders:
                appender.reset()
            self._appenders.clear()

    def _pool(self) -> AsyncPgAppenderPool:
        """The running loop's async PostgreSQL connections (opened on first use)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = AsyncPgAppenderPool(self.db.engine.url)
            self._pools[loop] = pool
        return pool

    def group_appender(self) -> GroupAppender:
        """The running loop's group commit (made on first use; see :mod:`dressage.store.pg_group_append`)."""
        loop = asyncio.get_running_loop()
        group = self._groups.get(loop)
        if group is None:
            group = GroupAppender(self._write_group)
            self._groups[loop] = group
        return group

    async def _write_group(self, items: list[GroupAppendItem]) -> list[int | None] | None:
        async with self._pool().appender() as appender:
            return await appender.append_group(items)

    def _thread_appender(self) -> PgTurnAppender:
        appender: PgTurnAppender | None = getattr(self._local, "appender", None)
        if appender is None:
            appender = PgTurnAppender(self.db.engine.url)
            self._local.appender = appender
            with self._lock:
                self._appenders.append(appender)
        return appender

    def _retry_or_raise(self, e: psycopg.Error, attempt: int) -> None:
        """After a failed append: return to retry it, or raise the translated error."""
        last = attempt == PG_APPEND_ATTEMPTS - 1
        if isinstance(e, psycopg.errors.UniqueViolation):
            if last:
                raise integrity_refusal(e) from e
            return  # a concurrent writer recorded the same key (or turn index): look again
        if isinstance(e, psycopg.OperationalError):
            if last:
                raise StoreError(
                    f"database write failed: {db_error_text(e, self.db.secrets)}; is PostgreSQL up?"
                ) from e
            return  # the connection broke: retry on a fresh one (the key makes it safe)
        if isinstance(
            e, psycopg.errors.IntegrityError
        ):  # a foreign key, NOT NULL or check: said in the log's words
            raise integrity_refusal(e) from e
        raise StoreError(f"database write failed: {db_error_text(e, self.db.secrets)}") from e


def _check_refusal(e: psycopg.errors.UniqueViolation, prep: PreparedTurn) -> None:
    """A unique index refused the append: return for a re-sent key; raise for a taken turn index."""
    if e.diag.constraint_name == TURN_INDEX_CONSTRAINT:
        raise turn_index_taken(prep) from e
    if e.diag.constraint_name != KEY_CONSTRAINT:
        raise e


def _outcome(diagnosis: tuple[Any, ...], r: Run, prep: PreparedTurn) -> AppendResult | None:
    """Why an append statement recorded nothing: the stored duplicate, an error, or None (retry).

    None means nothing explains it any more (e.g. a concurrent writer's race): try again.
    """
    old_position, old_hash, status, session_run_id, run_exists = diagnosis
    if old_position is not None:
        return check_duplicate(old_position, old_hash, prep.key, prep.content_hash)
    check_session(str(prep.row["session_id"]), r, status, session_run_id)
    if not run_exists:  # the same answer as the SQLite path's position counter
        raise UnknownRunError(f"run id {r.id} has no position counter; was it dropped?")
    return None
