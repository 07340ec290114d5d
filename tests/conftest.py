"""Shared fixtures: real SQLite and real PostgreSQL event logs.

PostgreSQL is expected at ``DRESSAGE_TEST_PG_URL`` (default: the local server on 127.0.0.1:5432,
database ``dressage_test_<pid>``, created fresh once per test session and dropped at its end). ``.ci/run`` makes sure it runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.store.db import upgrade

PG_ADMIN_URL = os.environ.get("DRESSAGE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_TEST_DB = os.environ.get("DRESSAGE_TEST_PG_DB", f"dressage_test_{os.getpid()}")


def create_pg_database(name: str) -> str:
    """(Re-)create database ``name`` on the test server and migrate it; returns its SQLAlchemy URL."""
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL} ({e}); start it (see .ci/run) "
            "or point DRESSAGE_TEST_PG_ADMIN_URL at a server"
        )
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    url = f"{base}/{name}"
    upgrade(url)
    return url


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A freshly created, migrated PostgreSQL database for this test session (dropped afterwards)."""
    yield create_pg_database(PG_TEST_DB)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{PG_TEST_DB}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database file for this test session."""
    path = tmp_path_factory.mktemp("sqlite") / "dressage.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend in turn: the same tests run on SQLite and PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(name)


@pytest.fixture
def store(db_url: str, tmp_path: Path) -> Iterator[EventStore]:
    """An :class:`EventStore` on each backend, with a local artifact directory."""
    settings = Settings(database_url=db_url, home=tmp_path / "home")
    s = EventStore.open(settings=settings, auto_upgrade=False)
    yield s
    s.close()


@pytest.fixture
def run_name() -> str:
    """A fresh run name (tests share a database per backend)."""
    return f"run-{uuid.uuid4().hex[:10]}"
