"""Users' ad-hoc SQL over the log (``dressage-worker sql``): one SELECT, read-only, rolled back."""

from __future__ import annotations

import re

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from dressage.errors import InvalidRecordError, StoreError
from dressage.redact import redact
from dressage.store.database import Database
from dressage.store.db import READONLY_OPTION

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def check_read_only(query: str) -> str:
    """Return ``query`` without its trailing semicolon if it is one SELECT/WITH statement.

    A first line of defence with a clear message; :func:`run_read_only` also runs the query in a
    read-only transaction that is rolled back, so a data-modifying CTE cannot write either.
    """
    stripped = query.strip().rstrip(";").strip()
    bare = _COMMENTS.sub(" ", stripped).strip()
    first = bare.split(None, 1)[0].upper() if bare else ""
    if first not in ("SELECT", "WITH"):
        raise InvalidRecordError(
            f"only SELECT or WITH queries are allowed, got {first or 'an empty query'!r}; "
            "use `dressage-worker drop` or `db` commands to change the log"
        )
    if ";" in _COMMENTS.sub(" ", stripped):
        raise InvalidRecordError("give one statement only (no ';' inside the query)")
    return stripped


def run_read_only(
    db: Database, query: str, *, limit: int
) -> tuple[list[str], list[tuple[object, ...]], bool]:
    """Run one SELECT in a read-only, rolled-back transaction; return columns, rows, truncated."""
    sql = check_read_only(query)
    sqlite = db.dialect == "sqlite"
    dbapi_error = db.engine.dialect.loaded_dbapi.Error
    try:
        with db.engine.connect() as conn:
            conn = conn.execution_options(**{READONLY_OPTION: True})
            trans = conn.begin()
            try:
                _guard(conn, sqlite, on=True)
                # The DBAPI cursor, without parameters, so '%' and ':name' in the query stay literal.
                cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
                try:
                    cursor.execute(sql)
                    columns = [d[0] for d in cursor.description or ()]
                    rows = [tuple(r) for r in cursor.fetchmany(limit + 1)] if columns else []
                finally:
                    cursor.close()
            finally:
                trans.rollback()
                if sqlite:
                    _guard(conn, sqlite, on=False)
    except dbapi_error as e:
        raise StoreError(
            f"query failed: {redact((str(e).strip() or type(e).__name__).splitlines()[0], db.secrets)}"
        ) from e
    except SQLAlchemyError as e:
        raise StoreError(f"query failed: {redact(first_line(e), db.secrets)}") from e
    return columns, rows[:limit], len(rows) > limit


def _guard(conn: Connection, sqlite: bool, *, on: bool) -> None:
    """Make the connection refuse writes (SQLite ``query_only``, PostgreSQL ``READ ONLY``)."""
    if sqlite:
        conn.exec_driver_sql(f"PRAGMA query_only = {'ON' if on else 'OFF'}")
    elif on:
        conn.exec_driver_sql("SET TRANSACTION READ ONLY")


def first_line(e: SQLAlchemyError) -> str:
    orig = getattr(e, "orig", None)
    return str(orig if orig is not None else e).strip().splitlines()[0]
