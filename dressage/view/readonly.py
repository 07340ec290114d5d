"""Read-only access to the event log for the viewer.

Every connection the viewer opens refuses writes at the database itself, not only by convention
(:mod:`dressage.store.readonly`). The schema must already be at head: the viewer never migrates.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from sqlalchemy import Connection

from dressage.config import Settings, normalize_database_url, require_database_file
from dressage.store import EventStore
from dressage.store.readonly import open_readonly_store_at


def open_readonly_store(settings: Settings, *, replica: bool = False) -> EventStore:
    """An :class:`EventStore` for reads only (artifacts from the settings' artifact directory).

    ``replica``: read from ``settings.replica_url`` when one is configured (a streaming replica
    serves the viewer's reads and spares the primary; pages show what it has replayed).
    """
    url = settings.resolved_database_url()
    if replica and settings.replica_url:
        url = normalize_database_url(settings.replica_url)
    require_database_file(url)
    return open_readonly_store_at(url, settings)


def reading(store: EventStore) -> AbstractContextManager[Connection]:
    """A read on the viewer's store (its connections refuse writes); database errors become
    :class:`~dressage.errors.StoreError` with the driver's first line, redacted."""
    return store.db.read()
