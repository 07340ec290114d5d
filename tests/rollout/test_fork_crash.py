"""A fork killed with ``kill -9`` mid-branch, then ``dressage-worker fork ... --resume``.

The fork's process dies while the engine holds branch 1's request for step 4 (the branches have
copied their shared turns and recorded some live ones). ``--resume`` takes every running branch
over: its recorded turns (copied and live) are answered from the log, the rest is generated. Every
branch ends exactly once, and the engine generates nothing for a turn any branch had recorded.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rollout.conftest import open_store, requires_bwrap
from tests.rollout.fork_harness import (
    SEED_STEP,
    TURNS,
    ForkScript,
    finish,
    record_parent,
    start_fork,
    turn_rows,
)
from tests.scripted_engine import ScriptedEngine

pytestmark = requires_bwrap
BRANCHES = 4
SEED = 200
HOLD = (4, SEED + 1)


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedEngine, ForkScript]]:
    script = ForkScript()
    with ScriptedEngine(script).running() as eng:
        yield eng, script


def test_kill_9_during_a_fork_then_resume(
    tmp_path: Path, any_db_url: str, scripted: tuple[ScriptedEngine, ForkScript]
) -> None:
    eng, script = scripted
    run, parent_id = record_parent(tmp_path, any_db_url, eng.url)
    home = tmp_path / "home"
    args = [parent_id, "--at-turn", str(SEED_STEP), "--branches", str(BRANCHES), "--seed", str(SEED)]
    args += ["--database-url", any_db_url]

    script.phase, script.hold = "first", HOLD
    proc = start_fork(args, home)
    try:
        assert script.reached.wait(120), finish(proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        # The killed worker's other branches may have requests queued at the engine behind the held
        # one: they are answered now, as "dead" ones, before the resume starts.
        script.phase = "dead"
        script.release.set()
    script.settle()
    script.phase = "resume"

    store = open_store(any_db_url, home)
    try:
        at_kill = {
            s.info["fork"]["seed"]: len(turn_rows(store, s.id))
            for s in store.sessions.list(run)
            if s.parent_session_id
        }
        assert at_kill[HOLD[1]] == HOLD[0]  # branch 1 recorded its turns up to the held one
        refused = start_fork(args, home)  # without --resume a second fork of the same branches is refused
        assert "add --resume" in refused.communicate(timeout=120)[0].decode() and refused.returncode == 1

        finish(start_fork([*args, "--resume"], home))
        children = [s for s in store.sessions.list(run) if s.parent_session_id == parent_id]
        assert len(children) == BRANCHES and {c.status for c in children} == {"finished"}
        finals = store.events.read(run, kinds=("session_finalized",))
        assert Counter(e.session_id for e in finals if e.session_id != parent_id) == {
            c.id: 1 for c in children
        }
        # Nothing a branch had recorded was generated again: each branch's resumed requests start at
        # the first turn it had not recorded (the killed request included).
        for c in children:
            seed = c.info["fork"]["seed"]
            steps = sorted(step for step, s in script.requests("resume") if s == seed)
            assert steps == list(range(max(at_kill.get(seed, 0), SEED_STEP), TURNS))
            assert turn_rows(store, c.id)[:SEED_STEP] == turn_rows(store, parent_id)[:SEED_STEP]
            assert len(turn_rows(store, c.id)) == TURNS and c.attempt >= 1
        assert all(step >= SEED_STEP for step, _ in script.requests("first"))
    finally:
        store.close()
