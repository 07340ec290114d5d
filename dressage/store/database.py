"""The event log's database: engine, connections, retries and positions.

Every repository of :class:`~dressage.store.event_store.EventStore` writes and reads through one
:class:`Database`. Every write is one transaction. Positions are dense and commit-ordered per run:
each append takes the next position from the run's counter row (``UPDATE ... RETURNING``) inside
its transaction, so the row lock orders commits and a tailer that reads ``position > p`` never
misses an event. Appends are idempotent by key: a retry after an ambiguous commit returns the
stored position, the same key with different content raises
:class:`~dressage.errors.IdempotencyConflictError`.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, Constraint, Index, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from dressage.errors import InvalidRecordError, StoreError, UnknownRunError
from dressage.redact import db_error_text
from dressage.store import schema as t
from dressage.store.db import READONLY_OPTION, current_revision
from dressage.store.records import DEFAULT_MAX_PAYLOAD_BYTES, AppendResult, canonical_json, check_duplicate

T = TypeVar("T")

RETRY_ATTEMPTS = 3
"""How often :meth:`Database.retrying` runs a transaction that lost a unique-key race."""


_REFUSED_BECAUSE = {
    "23503": "refers to a row the log does not hold (a foreign key)",
    "23505": "is already taken (a unique key)",
    "23502": "is required (NOT NULL)",
    "23514": "is out of range (a check)",
}
"""What each kind of integrity constraint (by PostgreSQL's SQLSTATE) says about the field it refused."""
_SQLITE_STATES = {"FOREIGN KEY": "23503", "UNIQUE": "23505", "NOT NULL": "23502", "CHECK": "23514"}
_SQLITE_REFUSAL = re.compile(r"^(FOREIGN KEY|UNIQUE|NOT NULL|CHECK) constraint failed(?:: (.*))?$")


def _constraint_columns(name: str) -> list[str]:
    """The columns of the log's constraint or unique index called ``name`` (none if it is not one)."""
    for table in t.metadata.tables.values():
        items: list[Constraint | Index] = [*table.constraints, *table.indexes]
        for item in items:
            if str(item.name) == name:
                return [str(c.name) for c in getattr(item, "columns", ())]
    return []


def integrity_refusal(e: Exception) -> InvalidRecordError:
    """An integrity error (SQLAlchemy's or psycopg's) in the log's words: the kind of constraint and
    the field it refused, never the driver's text (it names tables and constraints and can quote the
    statement or its values), so an HTTP answer or a command's output carries no SQL."""
    orig = getattr(e, "orig", None) or e
    state = getattr(orig, "sqlstate", None)
    columns: list[str] = []
    diag = getattr(orig, "diag", None)
    if state is not None and diag is not None:  # PostgreSQL
        columns = [diag.column_name] if diag.column_name else _constraint_columns(diag.constraint_name or "")
    elif m := _SQLITE_REFUSAL.match(str(orig).strip().splitlines()[0] if str(orig).strip() else ""):
        state = _SQLITE_STATES[m.group(1)]
        columns = [c.strip().rpartition(".")[2] for c in (m.group(2) or "").split(",") if "." in c]
    why = _REFUSED_BECAUSE.get(state or "", "breaks one of its constraints")
    field = ", ".join(columns) or None
    what = f"field {field!r}" if field else "the record"
    return InvalidRecordError(f"the log refused the record: {what} {why}", field=field)


class Database:
    """Connections to the log (SQLite or PostgreSQL) and the transactional event append."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.max_payload_bytes = max_payload_bytes
        self.secrets = secrets

    @property
    def dialect(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return str(self.engine.dialect.name)

    def schema_revision(self) -> str | None:
        """The migration revision the database is at (None for an empty database): what an export
        records so a reader knows which schema its rows came from."""
        return current_revision(self.engine)

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction; SQLAlchemy errors are translated to :class:`StoreError`."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise  # the callers decide: a lost race on a unique key, or bad input
        except SQLAlchemyError as e:
            raise StoreError(f"database write failed: {db_error_text(e, self.secrets)}") from e

    @contextmanager
    def read(self) -> Iterator[Connection]:
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

    def retrying(self, fn: Callable[[Connection], T], attempts: int = RETRY_ATTEMPTS) -> T:
        """Run ``fn(conn)`` in a write transaction; retry when a concurrent writer won a unique race."""
        for i in range(attempts):
            try:
                with self.write() as conn:
                    return fn(conn)
            except IntegrityError as e:
                if i == attempts - 1:
                    raise integrity_refusal(e) from e
        raise AssertionError("unreachable")

    def next_position(self, conn: Connection, run_id: int) -> int:
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

    def last_position(self, run_id: int) -> int:
        """The position of the run's newest event (0 when empty)."""
        with self.read() as conn:
            pos = conn.execute(
                select(t.run_counters.c.last_position).where(t.run_counters.c.run_id == run_id)
            ).scalar_one_or_none()
        return int(pos or 0)

    def append_event_tx(
        self,
        conn: Connection,
        run_id: int,
        kind: str,
        payload: Mapping[str, object],
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
        position = self.next_position(conn, run_id)
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
