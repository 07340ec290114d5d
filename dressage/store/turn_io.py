"""The hot paths of the log: appending a turn and reading turns back, per backend.

PostgreSQL: one statement per append (a data-modifying CTE that checks the key and the session,
takes the next position from the counter row and inserts the event and the turn), sent in autocommit
mode so the whole durable append is one round trip, with per-token arrays in binary wire format built
by numpy. Reads use a binary cursor that parses arrays straight into numpy.

SQLite: arrays are JSON text; reads parse integer arrays with numpy's text parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import psycopg
from psycopg import pq
from sqlalchemy import Connection
from sqlalchemy.engine import URL

from dressage.store.pg_arrays import (
    BOOL_ARRAY_OID,
    BYTEA_OID,
    FLOAT4_ARRAY_OID,
    INT4_ARRAY_OID,
    PgBoolArray,
    PgFloat4Array,
    PgInt4Array,
    register_dumpers,
    register_numpy_loaders,
)
from dressage.store.records import PreparedTurn

register_dumpers(psycopg.adapters)

TURN_COLUMNS = (
    "id",
    "run_id",
    "session_id",
    "turn_index",
    "lineage_index",
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

PG_APPEND_TURN_SQL = f"""
WITH s AS (
    SELECT status, run_id FROM sessions WHERE id = %(session_id)s
), existing AS (
    SELECT position, content_hash FROM events WHERE run_id = %(run_id)s AND idem_key = %(id)s
), c AS (
    UPDATE run_counters SET last_position = last_position + 1
    WHERE run_id = %(run_id)s
      AND NOT EXISTS (SELECT 1 FROM existing)
      AND EXISTS (SELECT 1 FROM s WHERE s.status = 'running' AND s.run_id = %(run_id)s)
    RETURNING last_position
), e AS (
    INSERT INTO events (run_id, position, kind, session_id, idem_key, content_hash, payload, created_at)
    SELECT %(run_id)s, c.last_position, 'turn', %(session_id)s, %(id)s, %(content_hash)s,
           %(event_payload)s::jsonb, %(created_at)s
    FROM c
    RETURNING position
), t AS (
    INSERT INTO turns ({", ".join(TURN_COLUMNS)})
    SELECT {", ".join("e.position" if c == "position" else f"%({c})s{_PG_CASTS.get(c, '')}" for c in TURN_COLUMNS)}
    FROM e
    RETURNING position
)
SELECT (SELECT position FROM t) AS new_position,
       (SELECT position FROM existing) AS old_position,
       (SELECT content_hash FROM existing) AS old_hash,
       (SELECT status FROM s) AS status,
       (SELECT run_id FROM s) AS session_run_id
"""


def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with ``%(name)s`` placeholders turned into ``$n``, and the names in ``$n`` order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), tuple(names)


_APPEND_SQL_POSITIONAL, APPEND_PARAM_NAMES = _positional(PG_APPEND_TURN_SQL)
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
_APPEND_PARAM_KINDS = tuple(
    (name, 0 if name not in _BINARY_PARAM_OIDS else (2 if name == "experts" else 1))
    for name in APPEND_PARAM_NAMES
)
"""(name, 0 = text scalar | 1 = numpy array in binary wire format | 2 = raw bytes) per ``$n``."""


def _text_param(value: Any) -> bytes | None:
    """A scalar bind parameter in PostgreSQL's text format (the server infers its type)."""
    if value is None:
        return None
    if value is True or value is False:
        return b"t" if value else b"f"
    if isinstance(value, str):
        return value.encode()
    return repr(value).encode()  # int and float: repr round-trips exactly


class PgTurnAppender:
    """A connection in autocommit mode that runs :data:`PG_APPEND_TURN_SQL` (one per thread).

    The statement is prepared once per connection and executed through psycopg's libpq binding
    (``pgconn.exec_prepared``) with the per-token arrays already in binary wire format: on a
    512-token turn this skips ~15 us of per-call adaptation work that psycopg's cursor layer does
    for 34 parameters. libpq releases the GIL while it waits for the server. Errors are raised as
    psycopg's own exception classes, so callers handle them like any psycopg error.
    """

    def __init__(self, url: URL) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._conn: psycopg.Connection[Any] | None = None

    def append(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """Run the append statement; returns (new_position, old_position, old_hash, status, session_run_id)."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._conninfo, autocommit=True, options="-c synchronous_commit=on -c timezone=UTC"
            )
            self._check(
                self._conn.pgconn.prepare(
                    _APPEND_STATEMENT, _APPEND_SQL_POSITIONAL.encode(), _APPEND_PARAM_OIDS
                ),
                pq.ExecStatus.COMMAND_OK,
            )
        values = [
            _text_param(value) if kind == 0 else (value.data if kind == 1 and value is not None else value)
            for name, kind in _APPEND_PARAM_KINDS
            for value in (params[name],)
        ]
        res = self._check(
            # libpq takes None for NULL; psycopg's stubs don't say so
            self._conn.pgconn.exec_prepared(_APPEND_STATEMENT, values, _APPEND_PARAM_FORMATS),  # type: ignore[arg-type]
            pq.ExecStatus.TUPLES_OK,
        )
        new_position, old_position, old_hash, status, session_run_id = (res.get_value(0, k) for k in range(5))
        return (
            int(new_position) if new_position is not None else None,
            int(old_position) if old_position is not None else None,
            old_hash.decode() if old_hash is not None else None,
            status.decode() if status is not None else None,
            int(session_run_id) if session_run_id is not None else None,
        )

    def _check(self, res: pq.abc.PGresult, expected: pq.ExecStatus) -> pq.abc.PGresult:
        """Raise the psycopg exception for a failed statement (a broken connection included)."""
        if res.status == expected:
            return res
        assert self._conn is not None
        if self._conn.pgconn.status == pq.ConnStatus.BAD:
            message = self._conn.pgconn.error_message.decode(errors="replace")
            self._conn.close()
            raise psycopg.OperationalError(f"the connection to PostgreSQL broke: {message}")
        raise psycopg.errors.error_from_result(res, encoding=self._conn.info.encoding)

    def reset(self) -> None:
        """Close the connection; the next append opens a fresh one."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class AsyncPgTurnAppender:
    """:class:`PgTurnAppender` on an async psycopg connection (used inside event loops)."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def append(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """Run the append statement; same answer as :meth:`PgTurnAppender.append`."""
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, options="-c synchronous_commit=on -c timezone=UTC"
            )
        cur = await self._conn.execute(PG_APPEND_TURN_SQL, params, prepare=True)
        row = await cur.fetchone()
        assert row is not None
        return tuple(row)

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


def pg_append_params(prep: PreparedTurn, run_id: int, now: float) -> dict[str, Any]:
    """Bind parameters for :data:`PG_APPEND_TURN_SQL` (arrays in binary wire format)."""
    row = prep.row
    params = dict(row)
    params.update(
        run_id=run_id,
        position=None,
        created_at=now,
        context_ids=PgInt4Array(prep.arrays["context_ids"]),
        generated_ids=PgInt4Array(prep.arrays["generated_ids"]),
        logprobs=PgFloat4Array(prep.arrays["logprobs"]),
        loss_mask=PgBoolArray(prep.arrays["loss_mask"]),
        policy_versions=PgInt4Array(prep.arrays["policy_versions"]),
        experts_shape=PgInt4Array(np.asarray(row["experts_shape"], dtype=np.int32))
        if row["experts_shape"] is not None
        else None,
        sampling_params=prep.json_text["sampling_params"],
        info=prep.json_text["info"],
        event_payload=orjson.dumps(prep.event_payload).decode(),
    )
    return params


def fetch_turn_rows(
    conn: Connection, where: str, params: dict[str, Any], *, with_experts: bool
) -> list[dict[str, Any]]:
    """Turn rows matching ``where`` (SQL over table ``turns``), per-token arrays as numpy."""
    cols = [c for c in TURN_COLUMNS if with_experts or c not in ("experts",)]
    sql = f"SELECT {', '.join(cols)} FROM turns WHERE {where} ORDER BY session_id, turn_index"
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection
        with raw.cursor(binary=True) as cur:  # type: ignore[union-attr]
            register_numpy_loaders(cur)
            cur.execute(sql, params)
            names = [d.name for d in cur.description or []]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        for r in rows:
            if r.get("experts") is not None:
                r["experts"] = bytes(r["experts"])
            if r.get("experts_shape") is not None:
                r["experts_shape"] = r["experts_shape"].tolist()
        return rows
    result = conn.exec_driver_sql(sql.replace("%(", ":").replace(")s", ""), params)
    out = []
    for m in result.mappings():
        d = dict(m)
        for name in ("context_ids", "generated_ids", "policy_versions"):
            d[name] = _sqlite_ints(d[name], np.int32)
        d["loss_mask"] = _sqlite_ints(d["loss_mask"], np.int8).astype(np.bool_)
        d["logprobs"] = _sqlite_floats(d["logprobs"])
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
    sql = (
        "SELECT context_ids, generated_ids, logprobs, loss_mask, policy_versions FROM turns "
        "WHERE run_id = %(run_id)s AND position > %(after)s AND position <= %(upto)s ORDER BY position"
    )
    params = {"run_id": run_id, "after": after, "upto": upto}
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection
        with raw.cursor(binary=True) as cur:  # type: ignore[union-attr]
            register_numpy_loaders(cur)
            cur.execute(sql, params)
            return [tuple(r) for r in cur.fetchall()]
    rows = conn.exec_driver_sql(sql.replace("%(", ":").replace(")s", ""), params).all()
    return [
        (
            _sqlite_ints(c, np.int32),
            _sqlite_ints(g, np.int32),
            _sqlite_floats(lp),
            _sqlite_ints(m, np.int8).astype(np.bool_),
            _sqlite_ints(v, np.int32),
        )
        for c, g, lp, m, v in rows
    ]


def _sqlite_floats(text: str) -> np.ndarray:
    """Parse a JSON float array into float32 (orjson: ~6x json.loads; exact for float32 values)."""
    return np.asarray(orjson.loads(text), dtype=np.float32)


def _sqlite_ints(text: str, dtype: type) -> np.ndarray:
    """Parse a JSON integer array quickly (numpy's text parser; ~5x json.loads)."""
    if len(text) <= 2:
        return np.empty(0, dtype=dtype)
    return np.fromstring(text[1:-1], dtype=dtype, sep=",")
