"""Reading the log from a PostgreSQL streaming replica (``DRESSAGE_REPLICA_URL`` / ``--replica-url``).

A hot standby replays the primary's WAL a little behind it. Readers that must see *everything*
the primary holds up to a point (the trainer: a batch formed from the replica must be
byte-identical to one formed from the primary) call :func:`wait_for_replay` first: it records the
primary's current WAL position (``pg_current_wal_lsn()``, which covers every transaction
committed so far, so every log position appended so far) and waits until the replica's
``pg_last_wal_replay_lsn()`` has passed it, or raises a :class:`~dressage.errors.StoreError`
that says how far behind the replica is. Writes (step commits, checkpoints) always go to the
primary; the replica store refuses them at the database (``default_transaction_read_only``).
"""

from __future__ import annotations

import time

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from dressage.config import Settings, normalize_database_url
from dressage.errors import ConfigError, StoreError
from dressage.redact import redact
from dressage.store.event_store import EventStore
from dressage.store.readonly import open_readonly_store_at

REPLAY_TIMEOUT_S = 60.0
"""How long a reader waits for the replica to replay past the primary's position before failing."""


def open_replica_store(settings: Settings) -> EventStore | None:
    """A read-only store on ``settings.replica_url`` (None when no replica is configured)."""
    if not settings.replica_url:
        return None
    url = normalize_database_url(settings.replica_url)
    if not url.startswith("postgresql"):
        raise ConfigError(
            "--replica-url must be a PostgreSQL URL (a streaming replica of the primary); "
            f"got {url.split(':', 1)[0]!r}"
        )
    return open_readonly_store_at(url, settings, what="the replica")


def wait_for_replay(
    primary: EventStore, replica: EventStore, *, timeout_s: float = REPLAY_TIMEOUT_S, poll_s: float = 0.02
) -> str:
    """Block until ``replica`` has replayed everything ``primary`` committed so far; returns that LSN.

    A replica that is not in recovery (``pg_last_wal_replay_lsn()`` is NULL: the URL points at a
    primary) is as fresh as its server and passes at once.
    """
    if primary.db.dialect != "postgresql" or replica.db.dialect != "postgresql":
        raise ConfigError("read replicas need PostgreSQL for both the log and the replica")
    try:
        with primary.db.engine.connect() as conn:
            target = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
        deadline = time.monotonic() + timeout_s
        with replica.db.engine.connect() as conn:
            while True:
                row = conn.execute(
                    text("SELECT pg_last_wal_replay_lsn(), pg_last_wal_replay_lsn() >= CAST(:t AS pg_lsn)"),
                    {"t": target},
                ).one()
                conn.rollback()  # a fresh snapshot each poll
                if row[0] is None or row[1]:
                    return target
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"the replica has replayed WAL up to {row[0]} but the reader needs {target} (the "
                        f"primary's position when it asked), still behind after {timeout_s:g}s; check "
                        "replication (pg_stat_replication on the primary) or read from the primary"
                    )
                time.sleep(poll_s)
    except SQLAlchemyError as e:
        raise StoreError(
            f"checking the replica's replay position failed: {redact(str(e), primary.db.secrets)}"
        ) from e
