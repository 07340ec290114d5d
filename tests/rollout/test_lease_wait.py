"""``rollout --resume`` says what it waits for and until when (issue 26, point 5).

After a kill -9 the dead worker's tasks stay leased until their leases expire; the resumed worker
used to wait silently (120 s by default) with its progress bar standing still.
"""

from __future__ import annotations

import time
from pathlib import Path

from dressage.config import Settings
from dressage.rollout.lease_wait import describe_lease_wait
from dressage.store import EventStore, TaskSpec


def test_the_wait_names_the_leases_their_owner_and_their_expiry(tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}", home=tmp_path))
    run = store.runs.create("r", {})
    store.tasks.enqueue(run, [TaskSpec(0, {}), TaskSpec(1, {})], n_samples=1)
    now = time.time()
    assert describe_lease_wait(store, run, "me") is None
    store.tasks.claim(run, "dead-worker-1", n=2, lease_s=120)
    text = describe_lease_wait(store, run, "me", now=now)
    assert text is not None
    assert text.startswith("waiting for 2 task(s) leased by dead-worker-1: ")
    assert " UTC (in 120 s; worker.lease_s)" in text and "their leases expire by " in text
    assert describe_lease_wait(store, run, "dead-worker-1") is None  # its own leases are not a wait
    store.close()
