"""A turn append racing a finalize of its session on PostgreSQL: no turn lands after the finalize.

The append statement checks the session's status inside its one statement; without a lock on the
session row a finalize that commits while the append waits for the run's counter row is not seen
(READ COMMITTED re-checks only the updated row, not the sub-select), and the turn would land after
``session_finalized``. The test makes that interleaving happen on purpose: a third connection holds
the session row, the finalize and then the append queue behind it, then it lets go.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from dressage.config import Settings
from dressage.errors import DressageError
from dressage.store import EventStore
from tests.store.writer_proc import make_turn


def _waiting(dsn: str, n: int) -> None:
    """Wait until ``n`` backends of this database wait for a lock."""
    deadline = time.monotonic() + 20
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            (count,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()  # type: ignore[misc]
            if count >= n:
                return
            time.sleep(0.02)
    raise AssertionError(f"{n} backends never waited for a lock")


@pytest.mark.postgres
def test_append_waiting_behind_a_finalize_does_not_land_after_it(pg_url: str) -> None:
    store = EventStore.open(settings=Settings(database_url=pg_url), auto_upgrade=False)
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    run = f"race-{uuid.uuid4().hex[:8]}"
    store.runs.create(run)
    sid = store.sessions.open(run).id
    store.turns.append(run, make_turn(sid, 0))
    outcome: dict[str, Any] = {}

    def finalize() -> None:
        outcome["final"] = store.sessions.finalize(sid, "finished", reward=1.0)

    def append() -> None:
        try:
            outcome["append"] = store.turns.append(run, make_turn(sid, 1))
        except DressageError as e:
            outcome["append_error"] = e

    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (sid,))
        finalizing = threading.Thread(target=finalize)
        finalizing.start()
        _waiting(dsn, 1)
        appending = threading.Thread(target=append)
        appending.start()
        _waiting(dsn, 2)
        holder.commit()
    finalizing.join(30)
    appending.join(30)
    store.close()
    assert outcome["final"].status == "finished"
    with psycopg.connect(dsn, autocommit=True) as conn:
        events = conn.execute(
            "SELECT position, kind FROM events WHERE session_id = %s ORDER BY position", (sid,)
        ).fetchall()
    kinds = [kind for _, kind in events]
    assert kinds[-1] == "session_finalized", kinds  # nothing after the finalize
    assert "append" not in outcome and "finished" in str(outcome["append_error"])
    assert kinds.count("turn") == 1
