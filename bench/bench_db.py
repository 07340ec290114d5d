"""A fresh, migrated PostgreSQL database for one benchmark run, dropped when the run ends.

Shared by the scripts in ``bench/`` (run as ``python bench/NAME.py``, so this folder is on
``sys.path``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from dressage.store import EventStore
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


def add_database_options(ap: argparse.ArgumentParser) -> None:
    """``--pg-url`` (default ``DRESSAGE_BENCH_PG_URL``) and ``--backends``, as every benchmark takes them."""
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("DRESSAGE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    ap.add_argument("--backends", default="postgresql,sqlite")


@contextlib.contextmanager
def migrated_database(backend: str, pg_url: str) -> Iterator[str]:
    """The URL of a fresh migrated database of ``backend`` (PostgreSQL or a temporary SQLite file)."""
    if backend == "postgresql":
        with fresh_database(pg_url) as db:
            yield db.url
    else:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            upgrade(url)
            yield url


@contextlib.contextmanager
def bench_store(backend: str, pg_url: str) -> Iterator[EventStore]:
    """An :class:`EventStore` on a fresh migrated database of ``backend``, closed and dropped on exit."""
    with migrated_database(backend, pg_url) as url:
        store = EventStore.open(url, auto_upgrade=False)
        try:
            yield store
        finally:
            store.close()
