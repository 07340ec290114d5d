"""Turns in the log: the durable append (sync and async) and the numpy read paths.

One turn row plus its ``turn`` event per transaction, before the agent sees the reply. On PostgreSQL
the whole append is one statement (see :mod:`dressage.store.turn_io`); the proxy uses
:meth:`TurnLogMixin.append_turn_async`, which runs it on async connections owned by its event loop.
Reads parse per-token arrays straight into numpy.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
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
from dressage.store.members import StoreMembers
from dressage.store.records import (
    AppendResult,
    PreparedTurn,
    Run,
    SessionHead,
    Turn,
    TurnRecord,
    check_duplicate,
    decode_experts,
    prepare_turn,
)
from dressage.store.turn_io import (
    KEY_CONSTRAINT,
    TURN_INDEX_CONSTRAINT,
    AsyncPgAppenderPool,
    PgTurnAppender,
    fetch_token_columns,
    fetch_turn_rows,
    pg_append_values,
)

if TYPE_CHECKING:
    import threading
    import weakref


PARALLEL_READ_MIN_EVENTS = 2_000
"""Runs with more events than twice this are read back over two PostgreSQL connections."""
PARALLEL_READ_MIN_SESSIONS = 32
"""``read_turns`` of at least twice this many sessions uses two PostgreSQL connections."""
PG_APPEND_ATTEMPTS = 3
"""How often a PostgreSQL append is tried (a lost unique-key race, a broken connection)."""


class TurnLogMixin(StoreMembers):
    """Turn methods of :class:`~dressage.store.event_store.EventStore`."""

    if TYPE_CHECKING:  # state of EventStore used only by the turn paths
        _local: threading.local
        _appenders: list[PgTurnAppender]
        _appenders_lock: threading.Lock
        _async_appenders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncPgAppenderPool]
        _writer: ThreadPoolExecutor | None

    def append_turn(self, run: str | Run, record: TurnRecord) -> AppendResult:
        """Record one LLM call: turn row + ``turn`` event in one transaction, before the agent sees it."""
        r = self.get_run(run)
        prep = prepare_turn(r.name, record, max_payload_bytes=self.max_payload_bytes)
        if self.dialect == "postgresql":
            return self._append_turn_pg(r, prep)

        def tx(conn: Connection) -> AppendResult:
            existing = conn.execute(
                select(t.events.c.position, t.events.c.content_hash).where(
                    t.events.c.run_id == r.id, t.events.c.idem_key == prep.key
                )
            ).first()
            if existing is not None:
                return check_duplicate(existing.position, existing.content_hash, prep.key, prep.content_hash)
            session = conn.execute(
                select(t.sessions.c.status, t.sessions.c.run_id).where(t.sessions.c.id == record.session_id)
            ).first()
            _check_session(
                record.session_id, r, session.status if session else None, session.run_id if session else None
            )
            position = self._next_position(conn, r.id)
            now = time.time()
            conn.execute(
                insert(t.events).values(
                    run_id=r.id,
                    position=position,
                    kind="turn",
                    session_id=record.session_id,
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
                    raise _turn_index_taken(prep) from e
                raise
            return AppendResult(position=position, key=prep.key, duplicate=False)

        return self._retrying(tx)

    def _append_turn_pg(self, r: Run, prep: PreparedTurn) -> AppendResult:
        """PostgreSQL: the whole durable append is one autocommit statement (see turn_io).

        It runs on a per-thread psycopg connection outside the SQLAlchemy pool: no pool pre-ping,
        no BEGIN/COMMIT round trips, a server-side prepared statement. When it records nothing, a
        second statement says why (a re-sent key, a closed session). A broken connection is
        replaced and the append retried; the idempotency key makes that safe.
        """
        values = pg_append_values(prep, r.id, time.time())
        for attempt in range(PG_APPEND_ATTEMPTS):
            appender = self._pg_appender()
            try:
                try:
                    position = appender.append(values)
                except psycopg.errors.UniqueViolation as e:
                    self._check_refusal(e, prep)
                    position = None  # the key is taken: the diagnosis finds the stored append
                if position is not None:
                    return AppendResult(position=position, key=prep.key, duplicate=False)
                result = self._pg_outcome(appender.diagnose(values), r, prep)
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

    async def append_turn_async(self, run: str | Run, record: TurnRecord) -> AppendResult:
        """:meth:`append_turn` for event loops (the proxy), without a thread hop on PostgreSQL.

        PostgreSQL appends run on a small pool of async psycopg connections owned by the running
        loop; SQLite appends run on one dedicated writer thread (SQLite writes serialise anyway).
        """
        r = self.get_run(run)
        if self.dialect != "postgresql":
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._writer_thread(), self.append_turn, r, record)
        prep = prepare_turn(r.name, record, max_payload_bytes=self.max_payload_bytes)
        values = pg_append_values(prep, r.id, time.time())
        pool = self._async_pool()
        for attempt in range(PG_APPEND_ATTEMPTS):
            async with pool.appender() as appender:
                try:
                    try:
                        position = await appender.append(values)
                    except psycopg.errors.UniqueViolation as e:
                        self._check_refusal(e, prep)
                        position = None
                    if position is not None:
                        return AppendResult(position=position, key=prep.key, duplicate=False)
                    result = self._pg_outcome(await appender.diagnose(values), r, prep)
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

    def _async_pool(self) -> AsyncPgAppenderPool:
        """The running loop's async PostgreSQL connections (opened on first use)."""
        pool = self._async_appenders.get(asyncio.get_running_loop())
        if pool is None:
            pool = AsyncPgAppenderPool(self.engine.url)
            self._async_appenders[asyncio.get_running_loop()] = pool
        return pool

    async def session_head_async(self, session_id: str) -> SessionHead:
        """:meth:`~dressage.store.EventStore.session_head` for event loops (the proxy, per request).

        On PostgreSQL one prepared statement on the loop's async connections: no thread hop, no
        pool pre-ping. A broken connection is replaced and the read tried once more.
        """
        if self.dialect != "postgresql":
            return await asyncio.to_thread(self.session_head, session_id)  # type: ignore[attr-defined]
        pool = self._async_pool()
        for attempt in range(2):
            async with pool.appender() as appender:
                try:
                    row = await appender.session_head(session_id)
                except psycopg.OperationalError as e:
                    await appender.reset()
                    if attempt:
                        raise StoreError(
                            f"database read failed: {db_error_text(e, self.secrets)}; is PostgreSQL up?"
                        ) from e
                    continue
                except psycopg.Error as e:
                    raise StoreError(f"database read failed: {db_error_text(e, self.secrets)}") from e
            if row is None:
                raise UnknownSessionError(f"no session {session_id!r} in the log")
            return SessionHead(row[0], 0 if row[1] is None else row[1] + 1, row[2])
        raise AssertionError("unreachable")

    async def aclose_async(self) -> None:
        """Close the async connections this loop opened for :meth:`append_turn_async`."""
        pool = self._async_appenders.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()

    def _writer_thread(self) -> ThreadPoolExecutor:
        with self._appenders_lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="dressage-writer")
            return self._writer

    def _retry_or_raise(self, e: psycopg.Error, attempt: int) -> None:
        """After a failed PostgreSQL append: return to retry it, or raise the translated error."""
        last = attempt == PG_APPEND_ATTEMPTS - 1
        if isinstance(e, psycopg.errors.UniqueViolation):
            if last:
                raise InvalidRecordError(f"the log refused the turn: {db_error_text(e, self.secrets)}") from e
            return  # a concurrent writer recorded the same key (or turn index): look again
        if isinstance(e, psycopg.OperationalError):
            if last:
                raise StoreError(
                    f"database write failed: {db_error_text(e, self.secrets)}; is PostgreSQL up?"
                ) from e
            return  # the connection broke: retry on a fresh one (the key makes it safe)
        raise StoreError(f"database write failed: {db_error_text(e, self.secrets)}") from e

    def _check_refusal(self, e: psycopg.errors.UniqueViolation, prep: PreparedTurn) -> None:
        """A unique index refused the append: return for a re-sent key; raise for a taken turn index."""
        if e.diag.constraint_name == TURN_INDEX_CONSTRAINT:
            raise _turn_index_taken(prep) from e
        if e.diag.constraint_name != KEY_CONSTRAINT:
            raise e

    def _pg_outcome(self, diagnosis: tuple[Any, ...], r: Run, prep: PreparedTurn) -> AppendResult | None:
        """Why an append statement recorded nothing: the stored duplicate, an error, or None (retry).

        None means nothing explains it any more (e.g. a concurrent writer's race): try again.
        """
        old_position, old_hash, status, session_run_id, run_exists = diagnosis
        if old_position is not None:
            return check_duplicate(old_position, old_hash, prep.key, prep.content_hash)
        _check_session(prep.row["session_id"], r, status, session_run_id)
        if not run_exists:  # the same answer as the SQLite path's position counter
            raise UnknownRunError(f"run id {r.id} has no position counter; was it dropped?")
        return None

    def _pg_appender(self) -> PgTurnAppender:
        appender = getattr(self._local, "appender", None)
        if appender is None:
            appender = PgTurnAppender(self.engine.url)
            self._local.appender = appender
            with self._appenders_lock:
                self._appenders.append(appender)
        return appender

    def read_turns(
        self,
        run: str | Run | None = None,
        *,
        session_id: str | None = None,
        session_ids: list[str] | None = None,
        with_experts: bool = True,
    ) -> list[Turn]:
        """Turns of a run or sessions, ordered by session then turn index, arrays as numpy.

        On PostgreSQL a long ``session_ids`` list is read over two connections at once: the server
        spends most of a big read encoding arrays, and two backends use both cores.
        """
        if (
            self.dialect == "postgresql"
            and session_ids is not None
            and len(session_ids) >= 2 * PARALLEL_READ_MIN_SESSIONS
        ):
            half = len(session_ids) // 2
            chunks = [session_ids[:half], session_ids[half:]]
            with ThreadPoolExecutor(2) as pool:
                parts = list(
                    pool.map(
                        lambda ids: self.read_turns(
                            run, session_id=session_id, session_ids=ids, with_experts=with_experts
                        ),
                        chunks,
                    )
                )
            return sorted(parts[0] + parts[1], key=lambda x: (x.session_id, x.turn_index))
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if run is not None:
            clauses.append("run_id = %(run_id)s")
            params["run_id"] = self.get_run(run).id
        if session_id is not None:
            clauses.append("session_id = %(session_id)s")
            params["session_id"] = session_id
        if session_ids is not None:
            if not session_ids:
                return []
            if self.dialect == "postgresql":  # one array parameter: the same (prepared) statement each time
                clauses.append("session_id = ANY(%(session_ids)s)")
                params["session_ids"] = list(session_ids)
            else:
                names = [f"s{i}" for i in range(len(session_ids))]
                clauses.append(f"session_id IN ({', '.join(f'%({n})s' for n in names)})")
                params.update(zip(names, session_ids, strict=True))
        with self._read() as conn:
            rows = fetch_turn_rows(conn, " AND ".join(clauses) or "1=1", params, with_experts=with_experts)
        return [_turn(x, with_experts) for x in rows]

    def read_token_arrays(self, run: str | Run) -> dict[str, np.ndarray]:
        """The whole run's tokens as flat numpy arrays (ids, logprobs, mask, versions) plus turn offsets.

        Turns are in position order. Context tokens get logprob NaN, loss_mask False and policy
        version -1. Only the array columns are read, straight into numpy.
        """
        r = self.get_run(run)
        bound = self.last_position(r)
        if self.dialect == "postgresql" and bound > 2 * PARALLEL_READ_MIN_EVENTS:
            # The server spends most of a big read encoding arrays; two connections use both cores.
            mid = bound // 2
            with ThreadPoolExecutor(2) as pool:
                parts = list(pool.map(lambda rng: self._token_columns(r.id, *rng), [(0, mid), (mid, bound)]))
            rows = parts[0] + parts[1]
        else:
            rows = self._token_columns(r.id, 0, bound)
        n_ctx = np.fromiter((row[0].size for row in rows), dtype=np.int64, count=len(rows))
        n_gen = np.fromiter((row[1].size for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(n_ctx + n_gen, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.empty(total, dtype=np.int32)
        logprobs = np.full(total, np.nan, dtype=np.float32)
        mask = np.zeros(total, dtype=np.bool_)
        versions = np.full(total, -1, dtype=np.int32)
        for k, (ctx, gen, lps, msk, vers) in enumerate(rows):
            start, mid, end = int(offsets[k]), int(offsets[k] + n_ctx[k]), int(offsets[k + 1])
            ids[start:mid] = ctx
            ids[mid:end] = gen
            logprobs[mid:end] = lps
            mask[mid:end] = msk
            versions[mid:end] = vers
        return {
            "token_ids": ids,
            "logprobs": logprobs,
            "loss_mask": mask,
            "policy_versions": versions,
            "turn_offsets": offsets,
        }

    def _token_columns(self, run_id: int, after: int, upto: int) -> list[tuple[np.ndarray, ...]]:
        with self._read() as conn:
            return fetch_token_columns(conn, run_id, after, upto)


def _turn_index_taken(prep: PreparedTurn) -> TurnIndexTakenError:
    """The error for a turn whose index its session already recorded under another key."""
    return TurnIndexTakenError(
        f"session {prep.row['session_id']} already has a turn {prep.row['turn_index']} recorded under "
        f"another key than {prep.key}; a turn index is recorded once per session"
    )


def _check_session(session_id: str, run: Run, status: str | None, session_run_id: int | None) -> None:
    """Raise the right error when a turn cannot go into ``session_id``."""
    if status is None:
        raise UnknownSessionError(f"no session {session_id!r}; open it before appending turns")
    if session_run_id != run.id:
        raise InvalidRecordError(f"session {session_id} belongs to another run than {run.name!r}")
    if status != "running":
        raise InvalidRecordError(f"session {session_id} is {status}; no more turns can be recorded")


def _turn(row: dict[str, Any], with_experts: bool) -> Turn:
    return Turn(
        id=row["id"],
        session_id=row["session_id"],
        turn_index=row["turn_index"],
        lineage_index=row["lineage_index"],
        parent_turn_id=row["parent_turn_id"],
        route=row["route"],
        segment_index=row["segment_index"],
        segment_offset=row["segment_offset"],
        boundary_reason=row["boundary_reason"],
        context_ids=row["context_ids"],
        generated_ids=row["generated_ids"],
        logprobs=row["logprobs"],
        loss_mask=row["loss_mask"],
        policy_versions=row["policy_versions"],
        routed_experts=decode_experts(
            row["experts"], row["experts_shape"], row["experts_dtype"], row["experts_codec"]
        )
        if with_experts
        else None,
        finish_reason=row["finish_reason"],
        sampling_params=row["sampling_params"] or {},
        request_fingerprint=row["request_fingerprint"],
        content_hash=row["content_hash"],
        latency_ms=row["latency_ms"],
        info=row["info"] or {},
        position=row["position"],
    )
