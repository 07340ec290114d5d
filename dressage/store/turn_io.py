"""The hot paths of the log: appending a turn and reading turns back, per backend.

PostgreSQL: one statement per append (a data-modifying CTE that checks the session, takes the next
position from the counter row and inserts the event and the turn; the unique index refuses a re-sent
key), sent in autocommit mode so the whole durable append is one round trip, with per-token arrays in
binary wire format built by numpy. Reads take the binary result column by column
(:mod:`dressage.store.pg_results`): arrays straight into numpy, no per-value Python loaders.

SQLite: arrays are JSON text; reads parse integer arrays with numpy's text parser.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import orjson
import psycopg
from psycopg import pq
from psycopg.generators import execute
from sqlalchemy import Connection
from sqlalchemy.engine import URL

from dressage.store.pg_arrays import (
    BOOL_ARRAY_OID,
    BYTEA_OID,
    FLOAT4_ARRAY_OID,
    INT4_ARRAY_OID,
    encode_array,
)
from dressage.store.pg_group_append import GroupAppendItem, run_group
from dressage.store.pg_results import Column, result_columns
from dressage.store.records import PreparedTurn, Turn

_PLACE_AND_TOKEN_COLUMNS: tuple[str, ...] = (
    "session_id",
    "turn_index",
    "thread_index",
    "parent_turn_id",
    "route",
    "segment_index",
    "segment_offset",
    "boundary_reason",
    "context_ids",
    "generated_ids",
    "logprobs",
    "loss_mask",
    "policy_versions",
)
"""A turn's place in its session (session, index, thread, parent, route, segment) and its per-token
arrays: the run of columns that :data:`TURN_COLUMNS` and :data:`TOKEN_FIELDS` share, in their order."""

TURN_COLUMNS = (
    "id",
    "run_id",
    *_PLACE_AND_TOKEN_COLUMNS,
    "n_context",
    "n_generated",
    "n_trained",
    "min_policy_version",
    "max_policy_version",
    "experts",
    "experts_shape",
    "experts_dtype",
    "experts_codec",
    "finish_reason",
    "sampling_params",
    "request_fingerprint",
    "content_hash",
    "latency_ms",
    "info",
    "position",
    "created_at",
)
_JSON_COLUMNS = ("sampling_params", "info")
_PG_CASTS = {"sampling_params": "::jsonb", "info": "::jsonb"}

APPEND_PARAM_NAMES = (
    "run_id",
    "session_id",
    "id",
    "content_hash",
    "event_payload",
    "created_at",
    *(
        c
        for c in TURN_COLUMNS
        if c not in ("run_id", "session_id", "id", "content_hash", "created_at", "position")
    ),
)
"""The append statement's parameters in ``$n`` order (:func:`pg_append_values` builds them)."""
_PARAM = {name: f"${i + 1}" for i, name in enumerate(APPEND_PARAM_NAMES)}

PG_APPEND_TURN_SQL = f"""
WITH c AS (
    UPDATE run_counters SET last_position = last_position + 1
    WHERE run_id = $1
      AND (SELECT s.run_id = $1 AND s.status = 'running' FROM sessions s WHERE s.id = $2 FOR SHARE)
    RETURNING last_position
), e AS (
    INSERT INTO events (run_id, position, kind, session_id, idem_key, content_hash, payload, created_at)
    SELECT $1, c.last_position, 'turn', $2, $3, $4, $5::jsonb, $6
    FROM c
    RETURNING position
)
INSERT INTO turns ({", ".join(TURN_COLUMNS)})
SELECT {", ".join("e.position" if c == "position" else _PARAM[c] + _PG_CASTS.get(c, "") for c in TURN_COLUMNS)}
FROM e
RETURNING position
"""
"""The durable append of one turn, one autocommit statement (one round trip, one WAL flush).

The counter row is bumped only when the session is running in this run; then the event and the
turn are inserted and the new position comes back. The session row is read ``FOR SHARE``: a
finalize that changed it and committed while this statement waited is seen (the locked row is
re-read at its newest version), so no turn lands after its session's ``session_finalized``. Every
transaction that changes a session's status locks the session row before the run's counter row,
in the same order as this statement, so the two never deadlock. The session is looked up by its primary key
alone (a lookup the planner cannot turn into a scan of the run's sessions). A re-sent key is not
looked up first: the unique index on ``(run_id, idem_key)`` refuses the event, the statement rolls
back whole, and :data:`PG_APPEND_DIAGNOSIS_SQL` then finds the stored position. It also says why
an append returned no row (a closed, unknown or foreign session). Keeping both checks out of the
happy path saves ~20 us of executor work per append, more on big runs.
"""

KEY_CONSTRAINT = "uq_events_run_id_idem_key"
"""The unique constraint that refuses a re-sent key (then the append is a duplicate or a conflict)."""
TURN_INDEX_CONSTRAINT = "uq_turns_session_id_turn_index"
"""The unique constraint that refuses a second turn with the same index in a session."""

PG_APPEND_DIAGNOSIS_SQL = """
SELECT (SELECT position FROM events WHERE run_id = $1 AND idem_key = $3) AS old_position,
       (SELECT content_hash FROM events WHERE run_id = $1 AND idem_key = $3) AS old_hash,
       (SELECT status FROM sessions WHERE id = $2) AS status,
       (SELECT run_id FROM sessions WHERE id = $2) AS session_run_id,
       EXISTS (SELECT 1 FROM run_counters WHERE run_id = $1) AS run_exists
"""
"""Why an append recorded nothing: (old_position, old_hash, status, session_run_id, run_exists)."""

_BINARY_PARAM_OIDS = {
    "context_ids": INT4_ARRAY_OID,
    "generated_ids": INT4_ARRAY_OID,
    "policy_versions": INT4_ARRAY_OID,
    "experts_shape": INT4_ARRAY_OID,
    "logprobs": FLOAT4_ARRAY_OID,
    "loss_mask": BOOL_ARRAY_OID,
    "experts": BYTEA_OID,
}
_APPEND_PARAM_OIDS = [_BINARY_PARAM_OIDS.get(name, 0) for name in APPEND_PARAM_NAMES]
_APPEND_PARAM_FORMATS = [1 if name in _BINARY_PARAM_OIDS else 0 for name in APPEND_PARAM_NAMES]
_APPEND_STATEMENT = b"dressage_append_turn"
_DIAGNOSIS_STATEMENT = b"dressage_append_diagnosis"
_CONNECT_OPTIONS = "-c synchronous_commit=on -c timezone=UTC"


def _text(value: str | float | None) -> bytes | None:
    """A scalar bind parameter in PostgreSQL's text format (the server infers its type)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return repr(value).encode()  # int and float: repr round-trips exactly


def pg_append_values(prep: PreparedTurn, run_id: int, now: float) -> list[bytes | None]:
    """Wire values of :data:`PG_APPEND_TURN_SQL`, in :data:`APPEND_PARAM_NAMES` order.

    Scalars in text format, per-token arrays in PostgreSQL's binary array format (built by numpy),
    experts as raw bytea. Written out field by field: a generic per-name loop costs ~20 us a turn.
    """
    row = prep.row
    shape = row["experts_shape"]
    values = [
        str(run_id).encode(),
        row["session_id"].encode(),
        prep.key.encode(),
        prep.content_hash.encode(),
        prep.json_bytes["event_payload"],
        repr(now).encode(),
        # the turn columns, in TURN_COLUMNS order without the six above and position
        str(row["turn_index"]).encode(),
        str(row["thread_index"]).encode(),
        _text(row["parent_turn_id"]),
        row["route"].encode(),
        str(row["segment_index"]).encode(),
        str(row["segment_offset"]).encode(),
        _text(row["boundary_reason"]),
        prep.wire["context_ids"],
        prep.wire["generated_ids"],
        prep.wire["logprobs"],
        prep.wire["loss_mask"],
        prep.wire["policy_versions"],
        str(row["n_context"]).encode(),
        str(row["n_generated"]).encode(),
        str(row["n_trained"]).encode(),
        _text(row["min_policy_version"]),
        _text(row["max_policy_version"]),
        row["experts"],
        encode_array(np.asarray(shape, dtype=np.int32), INT4_ARRAY_OID) if shape is not None else None,
        _text(row["experts_dtype"]),
        _text(row["experts_codec"]),
        _text(row["finish_reason"]),
        prep.json_bytes["sampling_params"],
        _text(row["request_fingerprint"]),
        _text(row["latency_ms"]),
        prep.json_bytes["info"],
    ]
    return values


def _diagnosis_values(values: list[bytes | None]) -> list[bytes | None]:
    """The parameters of :data:`PG_APPEND_DIAGNOSIS_SQL`: run id, session id and key of an append."""
    return values[:3]


def _diagnosis(res: pq.abc.PGresult) -> tuple[Any, ...]:
    old_position, old_hash, status, session_run_id, run_exists = (res.get_value(0, k) for k in range(5))
    return (
        int(old_position) if old_position is not None else None,
        old_hash.decode() if old_hash is not None else None,
        status.decode() if status is not None else None,
        int(session_run_id) if session_run_id is not None else None,
        run_exists == b"t",
    )


def _new_position(res: pq.abc.PGresult) -> int | None:
    """The position an append statement recorded, or None when it recorded nothing."""
    return int(res.get_value(0, 0)) if res.ntuples else None  # type: ignore[arg-type]


def _raise_for(res: pq.abc.PGresult, pgconn: pq.abc.PGconn, encoding: str) -> None:
    """Raise the psycopg exception for a failed statement (a broken connection included)."""
    if res.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        return
    if pgconn.status == pq.ConnStatus.BAD:
        message = pgconn.error_message.decode(errors="replace")
        raise psycopg.OperationalError(f"the connection to PostgreSQL broke: {message}")
    raise psycopg.errors.error_from_result(res, encoding=encoding)


class PgTurnAppender:
    """A connection in autocommit mode that runs :data:`PG_APPEND_TURN_SQL` (one per thread).

    The statement is prepared once per connection and executed through psycopg's libpq binding
    (``pgconn.exec_prepared``) with values already in wire format (:func:`pg_append_values`):
    psycopg's cursor layer would spend ~15 us adapting 32 parameters. libpq releases the GIL while
    it waits for the server. Errors are raised as psycopg's own exception classes, so callers
    handle them like any psycopg error.
    """

    def __init__(self, url: URL) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: psycopg.Connection[object] | None = None

    def append(self, values: list[bytes | None]) -> int | None:
        """Run the append statement; the new position, or None when nothing was recorded."""
        pgconn = self._connection().pgconn
        # libpq takes None for NULL; psycopg's stubs don't say so
        res = pgconn.exec_prepared(_APPEND_STATEMENT, values, _APPEND_PARAM_FORMATS)  # type: ignore[arg-type]
        self._check(res)
        return _new_position(res)

    def diagnose(self, values: list[bytes | None]) -> tuple[Any, ...]:
        """Why the append of ``values`` recorded nothing (see :data:`PG_APPEND_DIAGNOSIS_SQL`)."""
        pgconn = self._connection().pgconn
        res = pgconn.exec_prepared(_DIAGNOSIS_STATEMENT, _diagnosis_values(values))  # type: ignore[arg-type]
        self._check(res)
        return _diagnosis(res)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._conninfo, autocommit=True, options=_CONNECT_OPTIONS)
            pgconn = self._conn.pgconn
            self._check(pgconn.prepare(_APPEND_STATEMENT, PG_APPEND_TURN_SQL.encode(), _APPEND_PARAM_OIDS))
            self._check(pgconn.prepare(_DIAGNOSIS_STATEMENT, PG_APPEND_DIAGNOSIS_SQL.encode()))
        return self._conn

    def _check(self, res: pq.abc.PGresult) -> None:
        assert self._conn is not None
        try:
            _raise_for(res, self._conn.pgconn, self._conn.info.encoding)
        except psycopg.OperationalError:
            self._conn.close()
            raise

    def reset(self) -> None:
        """Close the connection; the next append opens a fresh one."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


SESSION_HEAD_SQL = "SELECT s.status, (SELECT max(turn_index) FROM turns WHERE session_id = s.id), s.attempt FROM sessions s WHERE s.id = $1"
"""A session's status, last turn index and attempt: what a proxy checks its cached state against."""
_HEAD_STATEMENT = b"dressage_session_head"


class AsyncPgTurnAppender:
    """:class:`PgTurnAppender` on an async psycopg connection (used inside event loops).

    The same prepared statements and wire values, sent with libpq's asynchronous calls and awaited
    through the connection's own wait loop, so the event loop runs while the server works.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection[object] | None = None

    async def append(self, values: list[bytes | None]) -> int | None:
        """Run the append statement; same answer as :meth:`PgTurnAppender.append`."""
        return _new_position(await self._run(_APPEND_STATEMENT, values, _APPEND_PARAM_FORMATS))

    async def append_group(self, items: list[GroupAppendItem]) -> list[int | None] | None:
        """Append ``items`` in one transaction (see :func:`~dressage.store.pg_group_append.run_group`)."""
        conn = await self._connection()
        try:
            return await run_group(conn, items, _APPEND_STATEMENT, _APPEND_PARAM_FORMATS)
        except psycopg.OperationalError:
            await conn.close()
            raise

    async def diagnose(self, values: list[bytes | None]) -> tuple[Any, ...]:
        """Same answer as :meth:`PgTurnAppender.diagnose`."""
        return _diagnosis(await self._run(_DIAGNOSIS_STATEMENT, _diagnosis_values(values), None))

    async def session_head(self, session_id: str) -> tuple[Any, ...] | None:
        """``(status, max turn_index, attempt)`` of a session, or None when absent (:data:`SESSION_HEAD_SQL`)."""
        res = await self._run(_HEAD_STATEMENT, [session_id.encode()], None)
        if res.ntuples == 0:
            return None
        status, last, attempt = res.get_value(0, 0), res.get_value(0, 1), res.get_value(0, 2)
        return (
            bytes(status or b"").decode(),
            None if last is None else int(bytes(last)),
            int(bytes(attempt or b"0")),
        )

    async def _run(
        self, statement: bytes, values: list[bytes | None], formats: list[int] | None
    ) -> pq.abc.PGresult:
        conn = await self._connection()
        conn.pgconn.send_query_prepared(statement, values, formats)
        return await self._result(conn)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, options=_CONNECT_OPTIONS
            )
            conn.pgconn.send_prepare(_APPEND_STATEMENT, PG_APPEND_TURN_SQL.encode(), _APPEND_PARAM_OIDS)
            await self._result(conn)
            conn.pgconn.send_prepare(_DIAGNOSIS_STATEMENT, PG_APPEND_DIAGNOSIS_SQL.encode())
            await self._result(conn)
            conn.pgconn.send_prepare(_HEAD_STATEMENT, SESSION_HEAD_SQL.encode())
            await self._result(conn)
        return self._conn

    async def _result(self, conn: psycopg.AsyncConnection[object]) -> pq.abc.PGresult:
        try:
            results = await conn.wait(execute(conn.pgconn))
            res = results[-1]
            _raise_for(res, conn.pgconn, conn.info.encoding)
        except psycopg.OperationalError:
            await conn.close()
            raise
        return cast("pq.abc.PGresult", res)

    async def reset(self) -> None:
        """Close the connection; the next append opens a fresh one."""
        if self._conn is not None:
            try:
                await self._conn.close()
            finally:
                self._conn = None


class AsyncPgAppenderPool:
    """A few :class:`AsyncPgTurnAppender` shared by the coroutines of one event loop."""

    def __init__(self, url: URL, size: int = 4) -> None:
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._all = [AsyncPgTurnAppender(conninfo) for _ in range(size)]
        self._idle: asyncio.LifoQueue[AsyncPgTurnAppender] = asyncio.LifoQueue()  # reuse the warmest
        for appender in self._all:
            self._idle.put_nowait(appender)

    @contextlib.asynccontextmanager
    async def appender(self) -> AsyncIterator[AsyncPgTurnAppender]:
        """Borrow an appender for one statement."""
        appender = await self._idle.get()
        try:
            yield appender
        finally:
            self._idle.put_nowait(appender)

    async def aclose(self) -> None:
        """Close every connection."""
        for appender in self._all:
            await appender.reset()


# Reads skip the two per-token arrays that are usually constant within a turn: the loss mask when
# every generated token is trained, the policy versions when one version generated the whole turn.
# The row's counts say what they hold, so the client rebuilds them; the server then encodes two
# arrays per turn fewer, which is most of a big read's cost on PostgreSQL.
_ELIDED = {
    "loss_mask": "CASE WHEN n_trained = n_generated THEN NULL ELSE loss_mask END AS loss_mask",
    "policy_versions": (
        "CASE WHEN min_policy_version = max_policy_version THEN NULL ELSE policy_versions END AS policy_versions"
    ),
}


def _restore_elided(
    mask: np.ndarray | None, versions: np.ndarray | None, n_generated: int, min_version: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The loss mask and policy versions a read skipped (see ``_ELIDED``), rebuilt from the counts."""
    if mask is None:
        mask = np.ones(n_generated, dtype=np.bool_)
    if versions is None:
        versions = np.full(n_generated, min_version if min_version is not None else 0, dtype=np.int32)
    return mask, versions


def _filled(values: Column, counts: list[int], fill: Sequence[object], dtype: type) -> Column:
    """``values`` with each None replaced by ``counts[i]`` copies of ``fill[i]`` (one numpy pass)."""
    missing = [i for i, v in enumerate(values) if v is None]
    if not missing:
        return values
    sizes = np.array([counts[i] for i in missing], dtype=np.int64)
    flat: np.ndarray = np.repeat(np.array([fill[i] for i in missing], dtype=dtype), sizes)
    ends = np.cumsum(sizes).tolist()
    out = list(values)
    for i, start, end in zip(missing, [0, *ends[:-1]], ends, strict=True):
        out[i] = flat[start:end]
    return out


def _restore_elided_columns(cols: dict[str, Column]) -> None:
    """:func:`_restore_elided` for whole PostgreSQL result columns, in place."""
    n_gen, low = cols.pop("n_generated_"), cols.pop("min_policy_version_")
    cols["loss_mask"] = _filled(cols["loss_mask"], n_gen, [True] * len(n_gen), np.bool_)
    versions = [0 if v is None else v for v in low]
    cols["policy_versions"] = _filled(cols["policy_versions"], n_gen, versions, np.int32)


def _sqlite_mask_and_versions(
    mask: str | None, versions: str | None, n_generated: int, min_version: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_restore_elided` for SQLite, whose arrays come as JSON text."""
    return _restore_elided(
        _sqlite_ints(mask, np.int8).astype(np.bool_) if mask is not None else None,
        _sqlite_ints(versions, np.int32) if versions is not None else None,
        n_generated,
        min_version,
    )


_ELISION_COUNTS = ("n_generated AS n_generated_", "min_policy_version AS min_policy_version_")
"""Selected after the row's columns on PostgreSQL: what rebuilds the elided arrays (then dropped)."""


def _pg_columns(conn: Connection, sql: str, params: Mapping[str, object]) -> dict[str, Column]:
    """The columns of ``sql``'s binary result, decoded column by column (no per-value loader calls)."""
    raw = conn.connection.driver_connection
    with raw.cursor(binary=True) as cur:  # type: ignore[union-attr]
        cur.execute(sql, params)
        res = cur.pgresult
        if res is None or res.status != pq.ExecStatus.TUPLES_OK:
            raise psycopg.ProgrammingError("the statement returned no rows to read")
        return result_columns(res)


def fetch_turn_rows(
    conn: Connection, where: str, params: dict[str, object], *, with_experts: bool
) -> list[dict[str, Any]]:
    """Turn rows matching ``where`` (SQL over table ``turns``), per-token arrays as numpy."""
    cols = [_ELIDED.get(c, c) for c in TURN_COLUMNS if with_experts or c not in ("experts",)]
    if conn.dialect.name == "postgresql":
        sql = f"SELECT {', '.join([*cols, *_ELISION_COUNTS])} FROM turns WHERE {where} ORDER BY session_id, turn_index"
        columns = _pg_columns(conn, sql, params)
        _restore_elided_columns(columns)
        columns["experts_shape"] = [None if v is None else v.tolist() for v in columns["experts_shape"]]
        names = list(columns)
        return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    sql = f"SELECT {', '.join(cols)} FROM turns WHERE {where} ORDER BY session_id, turn_index"
    result = conn.exec_driver_sql(sql.replace("%(", ":").replace(")s", ""), params)
    out = []
    for m in result.mappings():
        d = dict(m)
        for name in ("context_ids", "generated_ids"):
            d[name] = _sqlite_ints(d[name], np.int32)
        d["logprobs"] = _sqlite_floats(d["logprobs"])
        d["loss_mask"], d["policy_versions"] = _sqlite_mask_and_versions(
            d["loss_mask"], d["policy_versions"], d["n_generated"], d["min_policy_version"]
        )
        if d.get("experts_shape") is not None:
            d["experts_shape"] = orjson.loads(d["experts_shape"])
        for name in _JSON_COLUMNS:
            d[name] = orjson.loads(d[name]) if d[name] is not None else {}
        out.append(d)
    return out


def fetch_token_columns(conn: Connection, run_id: int, after: int, upto: int) -> list[tuple[np.ndarray, ...]]:
    """(context_ids, generated_ids, logprobs, loss_mask, policy_versions) of a run's turns by position.

    Only turns with ``after < position <= upto`` are read.
    """
    arrays = f"context_ids, generated_ids, logprobs, {_ELIDED['loss_mask']}, {_ELIDED['policy_versions']}"
    rest = "FROM turns WHERE run_id = %(run_id)s AND position > %(after)s AND position <= %(upto)s ORDER BY position"
    params = {"run_id": run_id, "after": after, "upto": upto}
    if conn.dialect.name == "postgresql":
        columns = _pg_columns(conn, f"SELECT {arrays}, {', '.join(_ELISION_COUNTS)} {rest}", params)
        _restore_elided_columns(columns)
        return list(zip(*columns.values(), strict=True))
    sql = f"SELECT {arrays}, n_generated, min_policy_version {rest}"
    rows = conn.exec_driver_sql(sql.replace("%(", ":").replace(")s", ""), params).all()
    return [
        (
            _sqlite_ints(c, np.int32),
            _sqlite_ints(g, np.int32),
            _sqlite_floats(lp),
            *_sqlite_mask_and_versions(m, v, n, low),
        )
        for c, g, lp, m, v, n, low in rows
    ]


def _sqlite_floats(text: str) -> np.ndarray:
    """Parse a JSON float array into float32 (orjson: ~6x json.loads; exact for float32 values)."""
    return np.asarray(orjson.loads(text), dtype=np.float32)


def _sqlite_ints(text: str, dtype: type) -> np.ndarray:
    """Parse a JSON integer array quickly (numpy's text parser; ~5x json.loads)."""
    if len(text) <= 2:
        return np.empty(0, dtype=dtype)
    return np.fromstring(text[1:-1], dtype=dtype, sep=",")


TOKEN_FIELDS = (
    *_PLACE_AND_TOKEN_COLUMNS,
    "finish_reason",
    "request_fingerprint",
    "latency_ms",
)
"""A turn row's fields that :class:`Turn` and :class:`NewTurn` take as they are stored (the log's
rows and an export's alike)."""


def token_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`TOKEN_FIELDS` of a turn row."""
    return {name: row[name] for name in TOKEN_FIELDS}


def turn_from_row(row: Mapping[str, Any], routed_experts: np.ndarray | None) -> Turn:
    """A :class:`Turn` from a row of :func:`fetch_turn_rows`, with its experts decoded by the caller
    (or None where they were not read)."""
    return Turn(
        id=row["id"],
        **token_fields(row),
        routed_experts=routed_experts,
        sampling_params=row["sampling_params"] or {},
        content_hash=row["content_hash"],
        info=row["info"] or {},
        position=row["position"],
    )
