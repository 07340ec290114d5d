"""A progress display never fails what it displays (issue 34, point 8): while the log cannot answer
its polls (here the ``tasks`` table is renamed away under it, on a real SQLite file), the loop's
rollout bar and the rollout's bar log one warning and go on; once the log answers again they count
again, and leaving them raises nothing."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from dressage.loop.progress import LoopProgress
from dressage.rollout.progress import RolloutProgress
from dressage.store import EventStore, Run, TaskSpec
from tests.rollout.conftest import open_store


def _log_with_two_done_pairs(tmp_path: Path) -> tuple[EventStore, Run, Path]:
    path = tmp_path / "log.db"
    store = open_store(f"sqlite:///{path}", tmp_path / "home")
    run = store.runs.create("display")
    store.tasks.enqueue(run.name, [TaskSpec(task_index=i, payload={}) for i in range(3)], n_samples=1)
    for lease in store.tasks.claim(run.name, "me", n=2):
        store.tasks.release(lease, "done")
    return store, run, path


def _rename(path: Path, old: str, new: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"ALTER TABLE {old} RENAME TO {new}")


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "progress display: could not read the log" in r.getMessage()
    ]


def test_the_loop_display_survives_a_log_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, run, path = _log_with_two_done_pairs(tmp_path)
    progress = LoopProgress(Console(file=StringIO(), width=120), 1)
    progress.attach(store, run)
    bars = progress._progress

    async def iteration() -> None:
        async with progress.rollout(0, 3, already_done=0):
            await _until(lambda: bars.tasks[0].completed == 2, "the first count")
            _rename(path, "tasks", "tasks_away")
            await _until(lambda: bool(_warnings(caplog)), "the warning")
            await asyncio.sleep(1.2)  # polls go on failing: still one warning
            _rename(path, "tasks_away", "tasks")
            lease = store.tasks.claim(run.name, "me")[0]
            store.tasks.release(lease, "done")
            await _until(lambda: bars.tasks[0].completed == 3, "a count after the outage")

    with caplog.at_level(logging.WARNING), progress:
        asyncio.run(iteration())  # no StoreError out of the display
    assert len(_warnings(caplog)) == 1 and "database read failed" in _warnings(caplog)[0]
    store.close()


def test_the_rollout_display_survives_a_log_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, run, path = _log_with_two_done_pairs(tmp_path)
    progress = RolloutProgress(store, run, console=Console(file=StringIO(), width=120))
    bar = progress._progress.tasks[0]

    async def rollout() -> None:
        async with progress:
            await _until(lambda: bar.completed == 2, "the first count")
            _rename(path, "tasks", "tasks_away")
            await _until(lambda: bool(_warnings(caplog)), "the warning")
        # left while the log still fails: no error either
        _rename(path, "tasks_away", "tasks")

    with caplog.at_level(logging.WARNING):
        asyncio.run(rollout())
    assert len(_warnings(caplog)) == 1
    assert asyncio.run(progress.refresh()).done == 2  # the log answers again
    store.close()
