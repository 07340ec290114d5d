"""Users' ad-hoc SQL over the log (``dressage-worker sql``, ``export --where``): read-only because the
database refuses to write, never because the text was inspected.

- PostgreSQL: a connection of its own (closed afterwards, never pooled) opens ``BEGIN READ ONLY``,
  refuses a login that a read-only transaction cannot hold (a superuser runs programs with
  ``COPY ... TO PROGRAM``; see :func:`_refuse_unbounded_login`), then sends the query as one
  prepared statement over the extended protocol, where the server refuses a second statement, and
  rolls back. The check reads the catalog first, so the query can no longer make the transaction
  read-write.
- SQLite: the file is opened ``mode=ro`` (a URI), with ``PRAGMA query_only`` and no room for an
  attached database; the sqlite3 module prepares one statement per execute and refuses a second.

No text is parsed, so literals holding ``;``, ``--`` or ``/*`` are plain SQL. A statement that
returns no rows (``SET``, ``COMMIT``, an empty query) is refused: nothing it did outlives the
rollback, and a blank answer would hide that.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from dressage.errors import InvalidRecordError, StoreError
from dressage.redact import redact
from dressage.store.database import Database
from dressage.store.db import SQLITE_BUSY_TIMEOUT_MS

Rows = tuple[list[str], list[tuple[object, ...]], bool]

_READ_ONLY_HINT = "sql is read-only: the database refuses every write"
_UNBOUNDED_LOGIN_SQL = """
SELECT r.rolname, r.rolsuper
FROM pg_roles r
WHERE (r.rolsuper OR r.rolreplication
       OR r.rolname IN ('pg_execute_server_program', 'pg_write_server_files'))
  AND pg_has_role(current_user, r.oid, 'MEMBER')
ORDER BY r.rolname <> current_user, r.rolname
"""
"""Roles the login is (or may become, by ``SET ROLE``) that act outside a read-only transaction:
superusers (programs, server files, everything), REPLICATION (slots that outlive the rollback),
and the predefined roles that run programs and write server files."""


def run_read_only(db: Database, query: str, *, limit: int) -> Rows:
    """Run one statement that the database itself keeps from writing; return columns, at most
    ``limit`` rows, and whether there were more. A refusal is one line (:class:`StoreError`)."""
    if not query.strip():
        raise InvalidRecordError("the query is empty; give one SQL statement, such as a SELECT")
    try:
        if db.dialect == "sqlite":
            return _run_sqlite(_sqlite_path(db), query, limit)
        return _run_postgres(db, query, limit)
    except (psycopg.Error, sqlite3.Error) as e:
        message = (str(e).strip() or type(e).__name__).splitlines()[0]
        raise StoreError(f"query failed: {redact(message, db.secrets)}{_hint(e)}") from e


def _run_postgres(db: Database, query: str, limit: int) -> Rows:
    raw = db.engine.raw_connection()
    conn: psycopg.Connection[Any] = raw.driver_connection  # type: ignore[assignment]
    try:
        conn.rollback()
        conn.autocommit = True  # the transaction below is ours, explicitly begun and rolled back
        with conn.cursor() as cur:
            cur.execute("BEGIN READ ONLY")
            _refuse_unbounded_login(cur)
            cur.execute(query.encode(), prepare=True)  # Parse refuses a second statement
            result = _fetch(cur.description, cur.statusmessage, cur.fetchmany, limit)
            cur.execute("ROLLBACK")
            return result
    finally:
        # Closed, never handed back to the pool with the user's session state; a transaction
        # still open (after an error) is rolled back by the server.
        raw.invalidate()


def _refuse_unbounded_login(cur: psycopg.Cursor[Any]) -> None:
    """Refuse a login that a read-only transaction does not bound (:data:`_UNBOUNDED_LOGIN_SQL`).

    Dropping privileges with ``SET ROLE`` would not do: such a login takes them back inside one
    statement (``DO``, ``set_config('role', ...)``). The way in is a role that has no more to give:
    ``dressage-worker db create-reader``.
    """
    cur.execute(_UNBOUNDED_LOGIN_SQL)
    found = cur.fetchall()
    if not found:
        return
    cur.execute("SELECT current_user")
    (user,) = cur.fetchone() or ("?",)
    name, superuser = found[0]
    if name == user:
        what = "is a superuser" if superuser else "has the REPLICATION attribute"
    else:
        what = f"may act as {name!r}" + (" (a superuser)" if superuser else "")
    raise StoreError(
        f"the database login {user!r} {what}, which a read-only transaction does not stop "
        "(COPY ... TO PROGRAM, server files, replication slots): connect as a reader role "
        "(dressage-worker db create-reader NAME, docs/sql.md) to run SQL over the log"
    )


def _sqlite_path(db: Database) -> Path:
    path = db.engine.url.database
    if not path or path == ":memory:":
        raise InvalidRecordError(
            "an in-memory SQLite database cannot be opened read-only by another connection; "
            "give a database file"
        )
    return Path(path).resolve()


def _run_sqlite(path: Path, query: str, limit: int) -> Rows:
    conn = sqlite3.connect(
        f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000
    )
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # ATTACH and VACUUM INTO are refused
        conn.execute("PRAGMA query_only = ON")
        conn.execute("BEGIN")  # deferred: a reader never takes the write lock
        cur = conn.execute(query)  # one statement: a second raises ProgrammingError
        return _fetch(cur.description, None, cur.fetchmany, limit)
    finally:
        conn.close()  # rolls back


def _fetch(description: Any, status: str | None, fetchmany: Any, limit: int) -> Rows:
    if not description:
        did = f" ({status})" if status else ""
        raise InvalidRecordError(
            f"the statement returned no rows{did}; sql answers queries such as SELECT, and "
            "rolls back whatever else runs"
        )
    columns = [d[0] for d in description]
    rows = [tuple(r) for r in fetchmany(limit + 1)]
    return columns, rows[:limit], len(rows) > limit


def _hint(e: Exception) -> str:
    """A short reason after the database's own message, where the message alone may puzzle."""
    text = str(e)
    if (isinstance(e, psycopg.Error) and e.sqlstate == "25006") or "readonly database" in text:
        return f" ({_READ_ONLY_HINT})"
    if "multiple commands" in text:
        return " (sql runs one statement)"
    return ""


def first_line(e: Exception) -> str:
    """The first line of a database error (the driver's message when SQLAlchemy wraps one)."""
    orig = getattr(e, "orig", None)
    return str(orig if orig is not None else e).strip().splitlines()[0]
