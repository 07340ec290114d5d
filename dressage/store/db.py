"""Database engines and schema migrations for the event log.

One seam for both backends: SQLite (embedded default; WAL, ``synchronous=FULL``, writers take the
lock up front with ``BEGIN IMMEDIATE``) and PostgreSQL through psycopg 3 (``synchronous_commit=on``,
so an acknowledged append survives a server crash).
"""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from dressage.config import DATABASE_CONNECT_TIMEOUT_S, normalize_database_url
from dressage.errors import ConfigError, SchemaError, StoreError

INSTALLED_MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
"""Where an installed package (wheel) carries the alembic scripts (setup.py maps them there)."""
CHECKOUT_MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
"""Their one source: the repository's top-level ``migrations/`` (a checkout or an editable install)."""

SQLITE_BUSY_TIMEOUT_MS = 120_000
READONLY_OPTION = "dressage_readonly"
"""Connection execution option marking a read-only transaction (SQLite then skips the write lock)."""


def with_connect_timeout(url: str, seconds: int = DATABASE_CONNECT_TIMEOUT_S) -> str:
    """A PostgreSQL ``url`` with libpq's ``connect_timeout`` (whole seconds) unless it names one.

    Without it a server host that is gone (no reset comes back) holds a connect for the kernel's
    SYN retries, about 2 minutes; every connection made from the engine's URL (SQLAlchemy's pool,
    the turn appenders' own psycopg connections) carries it. Other URLs are returned unchanged.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return url
    return parsed.update_query_dict({"connect_timeout": str(seconds)}).render_as_string(hide_password=False)


def make_engine(
    url: str, *, pool_size: int = 5, echo: bool = False, connect_timeout_s: int = DATABASE_CONNECT_TIMEOUT_S
) -> Engine:
    """Create a SQLAlchemy engine for ``url`` with the durability settings the log relies on (and,
    on PostgreSQL, a connect bounded by ``connect_timeout_s``: :func:`with_connect_timeout`)."""
    url = normalize_database_url(url)
    if url.startswith("sqlite"):
        return _make_sqlite_engine(url, echo=echo)
    if url.startswith("postgresql"):
        return create_engine(
            with_connect_timeout(url, connect_timeout_s),
            echo=echo,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=True,
            connect_args={"options": "-c synchronous_commit=on -c timezone=UTC"},
        )
    raise ConfigError(
        f"unsupported database URL {url.split(':', 1)[0]!r}: use sqlite:///PATH or postgresql+psycopg://..."
    )


def _make_sqlite_engine(url: str, *, echo: bool) -> Engine:
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        echo=echo,
        poolclass=NullPool if path in ("", ":memory:") else None,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "isolation_level": None},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock at BEGIN: a deferred transaction that later upgrades to a writer
        # can fail with SQLITE_BUSY without waiting. Readers (execution option ``readonly``) don't.
        readonly = conn.get_execution_options().get(READONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def migrations_dir() -> Path:
    """The alembic scripts: inside the installed package, else the checkout's ``migrations/``."""
    for candidate in (INSTALLED_MIGRATIONS_DIR, CHECKOUT_MIGRATIONS_DIR):
        if (candidate / "env.py").is_file():
            return candidate
    raise SchemaError(
        f"alembic migrations not found in the package ({INSTALLED_MIGRATIONS_DIR}) nor in a checkout "
        f"({CHECKOUT_MIGRATIONS_DIR}); reinstall Dressage from a wheel or a checkout"
    )


def alembic_config(url: str) -> Config:
    """An alembic Config pointing at the project's migrations and ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", normalize_database_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (``dressage-worker db upgrade``)."""
    try:
        command.upgrade(alembic_config(url), revision)
    except SQLAlchemyError as e:
        raise StoreError(f"could not upgrade the schema at {_safe_url(url)}: {e}") from e


def downgrade(url: str, revision: str) -> None:
    """Revert migrations down to ``revision`` (``base`` removes every table)."""
    try:
        command.downgrade(alembic_config(url), revision)
    except SQLAlchemyError as e:
        raise StoreError(f"could not downgrade the schema at {_safe_url(url)}: {e}") from e


def head_revision() -> str:
    """The newest revision in the migrations directory.

    Every :class:`EventStore` open asks for it (to check the schema is at head), and reading it
    loads every migration script; it is read once per process per state of the ``versions/`` folder
    (its path and mtime: a script added or removed there changes it).
    """
    folder = migrations_dir()
    versions = folder / "versions"
    return _head_of(str(folder), versions.stat().st_mtime_ns if versions.is_dir() else -1)


@functools.lru_cache(maxsize=4)
def _head_of(folder: str, versions_mtime_ns: int) -> str:
    """The head revision of the project's migrations; ``folder`` and ``versions_mtime_ns`` are
    :func:`head_revision`'s cache key only."""
    del folder, versions_mtime_ns
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as conn:
        conn.execution_options(**{READONLY_OPTION: True})
        return MigrationContext.configure(conn).get_current_revision()


def ensure_schema(engine: Engine, *, auto_upgrade: bool) -> None:
    """Check the schema is at head; upgrade it when ``auto_upgrade``, else raise :class:`SchemaError`."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    if auto_upgrade:
        upgrade(engine.url.render_as_string(hide_password=False))
        return
    raise SchemaError(
        f"the database at {_safe_url(str(engine.url))} is at schema revision {current or 'none'}, "
        f"expected {head}: run `dressage-worker db upgrade`"
    )


def _safe_url(url: str) -> str:
    """A URL with its password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # a malformed URL still deserves an error message
        return "<database url>"
