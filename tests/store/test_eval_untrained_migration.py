"""Migration 0009: ``trajectories.n_trained_tokens`` is 0 for an eval session (never trained,
although its turns record loss mask 1); a downgrade to 0008 puts the old count back, an upgrade
the new one, on both backends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.store.db import downgrade, upgrade
from tests.conftest import create_pg_database
from tests.store.migration_checks import select_rows, sqlite_database
from tests.view.builders import build_eval_run


def _trained(url: str) -> dict[str, tuple[object, ...]]:
    rows = select_rows(url, "SELECT session_id, kind, n_tokens, n_trained_tokens FROM trajectories")
    return {str(r[0]): tuple(r[1:]) for r in rows}


def _roundtrip(url: str, tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"), auto_upgrade=False)
    try:
        ev = build_eval_run(store, "evals")
        summary = store.runs.summary("evals")
    finally:
        store.close()
    assert len(ev.train) == 2 and len(ev.evals) == 3
    # each session: one turn of 2 context tokens and 1 generated token recorded with loss mask 1
    assert (summary.tokens, summary.trained_tokens) == (15, 2)
    head = _trained(url)
    assert {s: head[s] for s in ev.train} == {s: ("train", 3, 1) for s in ev.train}
    assert {s: head[s] for s in ev.evals} == {s: ("eval", 3, 0) for s in ev.evals}
    downgrade(url, "0008")
    assert {s: _trained(url)[s] for s in ev.evals} == {s: ("eval", 3, 1) for s in ev.evals}
    upgrade(url)
    assert _trained(url) == head


def test_eval_sessions_train_no_token_on_sqlite(tmp_path: Path) -> None:
    _roundtrip(sqlite_database(tmp_path, "evals.db"), tmp_path)


@pytest.mark.postgres
def test_eval_sessions_train_no_token_on_postgresql(tmp_path: Path) -> None:
    _roundtrip(create_pg_database(f"dressage_test_eval_untrained_{os.getpid()}"), tmp_path)
