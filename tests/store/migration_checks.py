"""What the migration round-trip tests share: a fresh migrated SQLite database and rows read by SQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from dressage.store.db import make_engine, upgrade


def sqlite_database(tmp_path: Path, filename: str) -> str:
    """The URL of a new SQLite database ``tmp_path / filename``, migrated to head (the SQLite twin of
    :func:`tests.conftest.create_pg_database`)."""
    url = f"sqlite:///{tmp_path / filename}"
    upgrade(url)
    return url


def select_rows(url: str, sql: str) -> list[tuple[object, ...]]:
    """The rows ``sql`` selects from the database at ``url``, as tuples, read on an engine of their own
    (disposed after, so a migration that runs next finds no open connection)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()
