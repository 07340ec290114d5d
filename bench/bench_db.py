"""A fresh, migrated PostgreSQL database for one benchmark run, dropped when the run ends.

Shared by the scripts in ``bench/`` (run as ``python bench/NAME.py``, so this folder is on
``sys.path``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from dressage.store.db import upgrade


@dataclass(frozen=True)
class BenchDatabase:
    """Where the database is: ``url`` for :class:`EventStore` (psycopg 3 driver), ``conninfo`` for psycopg."""

    name: str
    url: str
    conninfo: str


@contextlib.contextmanager
def fresh_database(admin_url: str, *, connect_timeout: int = 5) -> Iterator[BenchDatabase]:
    """Create ``dressage_bench_<random>`` on the server of ``admin_url``, migrate it, drop it on exit."""
    name = f"dressage_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=connect_timeout) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    conninfo = f"{admin_url.rsplit('/', 1)[0]}/{name}"
    try:
        db = BenchDatabase(name, conninfo.replace("postgresql://", "postgresql+psycopg://", 1), conninfo)
        upgrade(db.url)
        yield db
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=connect_timeout) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
