"""Open a test's :class:`EventStore` on an already upgraded database, closed when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dressage.config import Settings
from dressage.store import EventStore


@contextmanager
def open_store(url: str, home: Path) -> Iterator[EventStore]:
    """An :class:`EventStore` on ``url`` (migrated already: no auto-upgrade) with artifacts under ``home``."""
    store = EventStore.open(settings=Settings(database_url=url, home=home), auto_upgrade=False)
    try:
        yield store
    finally:
        store.close()
