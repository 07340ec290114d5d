"""Migration 0007: a session records the session it was forked from and its fork turn; the
``session_tree`` view walks the forks; the columns survive a downgrade to 0006 and back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.store import EventStore, NewTurn
from dressage.store.db import downgrade, upgrade
from tests.conftest import create_pg_database
from tests.store.migration_checks import select_rows, sqlite_database


def _record(store: EventStore, session_id: str, turns: int) -> None:
    for i in range(turns):
        store.turns.append("forks", NewTurn(session_id, i, [1, 2, 3 + i], [7], [-0.5], [0]))


def _tree(url: str) -> list[tuple[object, ...]]:
    return sorted(
        select_rows(
            url, "SELECT session_id, parent_session_id, fork_turn, depth, root_session_id FROM session_tree"
        )
    )


def _roundtrip(url: str, tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"), auto_upgrade=False)
    try:
        store.runs.create("forks")
        root = store.sessions.open("forks", session_id="root")
        _record(store, root.id, 4)
        child = store.sessions.open("forks", session_id="child", parent_session_id="root", fork_turn=3)
        assert (child.parent_session_id, child.fork_turn) == ("root", 3)
        _record(store, child.id, 5)
        grandchild = store.sessions.open(
            "forks", session_id="grandchild", parent_session_id="child", fork_turn=4
        )
        assert store.sessions.get(grandchild.id).fork_turn == 4
        with pytest.raises(ValueError, match="past session 'root'"):
            store.sessions.open("forks", session_id="too-far", parent_session_id="root", fork_turn=5)
        with pytest.raises(ValueError, match="both parent_session_id and fork_turn"):
            store.sessions.open("forks", session_id="half", parent_session_id="root")
    finally:
        store.close()
    expected = [
        ("child", "root", 3, 1, "root"),
        ("grandchild", "child", 4, 2, "root"),
        ("root", None, None, 0, "root"),
    ]
    assert _tree(url) == expected
    downgrade(url, "0006")
    upgrade(url)
    assert _tree(url) == [
        ("child", None, None, 0, "child"),
        ("grandchild", None, None, 0, "grandchild"),
        ("root", None, None, 0, "root"),
    ]  # a downgrade forgets the forks, keeps the sessions


def test_session_forks_on_sqlite(tmp_path: Path) -> None:
    _roundtrip(sqlite_database(tmp_path, "forks.db"), tmp_path)


def test_session_forks_on_postgresql(tmp_path: Path) -> None:
    _roundtrip(create_pg_database(f"dressage_test_forks_{os.getpid()}"), tmp_path)
