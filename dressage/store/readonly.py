"""Read-only stores: every connection refuses writes at the database itself, not by convention.

SQLite connections run with ``PRAGMA query_only`` and start deferred transactions (``BEGIN``, never
the writer lock a rollout worker would wait on); PostgreSQL sessions start with
``default_transaction_read_only``. The schema must already be at head: a reader never migrates.
The viewer (:mod:`dressage.view.readonly`) and the trainer's streaming replica
(:mod:`dressage.store.replica`) open their stores here.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from dressage.config import Settings, normalize_database_url
from dressage.errors import ConfigError, StoreError
from dressage.store.artifacts import LocalBlobStore
from dressage.store.db import SQLITE_BUSY_TIMEOUT_MS, ensure_schema, with_connect_timeout
from dressage.store.event_store import EventStore
from dressage.store.reach import cannot_open


def make_readonly_engine(url: str) -> Engine:
    """An engine on ``url`` whose every connection is read-only at the database level."""
    url = normalize_database_url(url)
    if url.startswith("postgresql"):
        return create_engine(
            with_connect_timeout(url),
            pool_size=4,
            max_overflow=4,
            pool_pre_ping=True,
            connect_args={"options": "-c default_transaction_read_only=on -c timezone=UTC"},
        )
    if not url.startswith("sqlite"):
        raise ConfigError(
            f"unsupported database URL {url.split(':', 1)[0]!r}: use sqlite:///PATH or postgresql://..."
        )
    path = url.split(":///", 1)[1] if ":///" in url else ""
    engine = create_engine(
        url,
        poolclass=NullPool if path in ("", ":memory:") else None,
        connect_args={
            "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
            "isolation_level": None,
            "check_same_thread": False,
        },
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA query_only=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")  # deferred: a reader never takes the write lock

    return engine


def open_readonly_store_at(url: str, settings: Settings, *, what: str = "the database") -> EventStore:
    """A read-only :class:`EventStore` on ``url`` (artifacts from the settings' artifact directory);
    ``what`` names the database in the error when it cannot be reached."""
    engine = make_readonly_engine(url)
    try:
        ensure_schema(engine, auto_upgrade=False)
    except OperationalError as e:
        engine.dispose()
        raise StoreError(cannot_open(what, engine.url, e.orig)) from e
    return EventStore(
        engine,
        blobs=LocalBlobStore(settings.resolved_artifacts_dir()),
        max_payload_bytes=settings.max_payload_bytes,
        secrets=tuple(x.get_secret_value() for x in settings.secrets),
    )
