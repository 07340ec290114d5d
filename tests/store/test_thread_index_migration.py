"""Migration 0005: ``turns.lineage_index`` becomes ``thread_index``; the old name stays readable."""

from __future__ import annotations

import os
from pathlib import Path

from dressage.config import Settings
from dressage.store import EventStore, NewTurn
from dressage.store.db import downgrade, upgrade
from tests.conftest import create_pg_database
from tests.store.migration_checks import select_rows, sqlite_database


def _lineage_column(url: str) -> list[tuple[object, ...]]:
    return select_rows(url, "SELECT turn_index, lineage_index FROM turns ORDER BY turn_index")


def _roundtrip(url: str, tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"), auto_upgrade=False)
    try:
        store.runs.create("threads")
        s = store.sessions.open("threads")
        for i, thread in enumerate((0, 1, 1)):
            turn = NewTurn(
                s.id, i, [1, 2], [3], [-0.5], [0], thread_index=thread, route="create" if i < 2 else "append"
            )
            store.turns.append("threads", turn)
        assert [t.thread_index for t in store.turns.read("threads")] == [0, 1, 1]
    finally:
        store.close()
    assert _lineage_column(url) == [(0, 0), (1, 1), (2, 1)]  # the compatibility column, at head
    downgrade(url, "0004")
    assert _lineage_column(url) == [(0, 0), (1, 1), (2, 1)]  # the real column again
    upgrade(url)
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"), auto_upgrade=False)
    try:
        assert [t.thread_index for t in store.turns.read("threads")] == [0, 1, 1]
    finally:
        store.close()


def test_thread_index_migration_on_sqlite(tmp_path: Path) -> None:
    _roundtrip(sqlite_database(tmp_path, "threads.db"), tmp_path)


def test_thread_index_migration_on_postgresql(tmp_path: Path) -> None:
    _roundtrip(create_pg_database(f"dressage_test_threads_{os.getpid()}"), tmp_path)
