"""Tree rollouts (``branching:``) with real ``dressage-worker rollout`` processes, killed and resumed.

A 6-turn tool loop (the coding agent in bwrap sandboxes, a scripted engine that counts its requests:
:mod:`tests.rollout.fork_harness`), one root per task, ``branching: {width: 2, depth: 2, at: turns,
turns: [2, 4]}``: the root forks at turns 2 and 4, each branch forked at 2 forks again at 4, so a
tree holds 1 + 2 + 2 + 2 x 2 = 9 sessions. The worker is killed with ``kill -9`` while one branch
waits on the engine for a live turn (its earlier turns recorded), then ``--resume`` finishes the run.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dressage.store import EventStore
from dressage.training.groups import GroupTracker
from tests.rollout.conftest import open_store, requires_bwrap, start_worker
from tests.rollout.fork_harness import TURNS, ForkScript, finish, parent_config
from tests.scripted_engine import ScriptedEngine

pytestmark = requires_bwrap
BRANCHING = {"width": 2, "depth": 2, "at": "turns", "turns": [2, 4]}
TREE_SIZE = 9


@dataclass
class TreeScript(ForkScript):
    """:class:`ForkScript` holding the first live request of a branch at ``hold_step`` (phase ``first``)."""

    hold_step: int = 3
    root_seed: object = None
    held: int = 0

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        step, seed = prompt.count("<tool_response>"), sampling.get("sampling_seed")
        if self.root_seed is None:
            self.root_seed = seed
        if self.phase == "first" and step == self.hold_step and seed != self.root_seed and not self.held:
            self.held += 1
            self.calls.append((self.phase, step, seed))
            self.reached.set()
            self.release.wait(120)  # the engine's loop waits here: no other request is answered meanwhile
            return "unused"
        return super().__call__(prompt, n, sampling)


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedEngine, TreeScript]]:
    script = TreeScript(phase="first")
    with ScriptedEngine(script).running() as eng:
        yield eng, script


def _config(tmp: Path, engine_url: str) -> Path:
    return parent_config(
        tmp,
        engine_url,
        branching=BRANCHING,
        worker={"concurrency": 2, "lease_s": 3, "max_attempts": 3, "session_timeout_s": 120},
    )


def _check_tree(store: EventStore, run: str) -> list[str]:
    """Every session of the one tree ended exactly once, finished; returns the session ids."""
    sessions = store.sessions.list(run)
    assert len(sessions) == TREE_SIZE and all(s.status == "finished" for s in sessions), [
        (s.id, s.status, s.error) for s in sessions
    ]
    (root,) = [s for s in sessions if s.parent_session_id is None]
    shape = Counter((s.parent_session_id == root.id, s.fork_turn) for s in sessions if s.parent_session_id)
    assert shape == {(True, 2): 2, (True, 4): 2, (False, 4): 4}
    finals = Counter(e.session_id for e in store.events.read(run, kinds=("session_finalized",), limit=10_000))
    assert set(finals) == {s.id for s in sessions} and set(finals.values()) == {1}
    assert store.tasks.counts(run) == {"pending": 0, "leased": 0, "done": 1, "failed": 0}
    return [s.id for s in sessions]


def _live_turns(store: EventStore, session_ids: list[str]) -> int:
    turns = store.turns.read(session_ids=session_ids, with_experts=False)
    return sum("replayed_from" not in t.info for t in turns)


def test_kill_9_during_a_tree_rollout_then_resume(
    tmp_path: Path, any_db_url: str, scripted: tuple[ScriptedEngine, TreeScript]
) -> None:
    eng, script = scripted
    home = tmp_path / "home"
    cfg = _config(tmp_path, eng.url)
    name = yaml.safe_load(cfg.read_text())["run"]
    proc = start_worker(["--config", str(cfg), "--database-url", any_db_url], home)
    try:
        assert script.reached.wait(180), finish(proc)
        time.sleep(0.5)  # requests answered before the hold land in the log
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        script.phase = "dead"  # what the engine answers now goes to the killed worker: never recorded
        script.release.set()
    time.sleep(1.0)
    script.phase = "resume"
    store = open_store(any_db_url, home)
    try:
        at_kill = store.sessions.list(name)
        assert any(s.status == "running" and s.parent_session_id for s in at_kill)
        finish(start_worker(["--resume", name, "--database-url", any_db_url], home))
        ids = _check_tree(store, name)
        # No token generated twice: every engine request answered to a live worker made exactly one
        # recorded live turn (the held request was never answered; replayed turns cost no request).
        answered = len(script.requests("first")) - script.held + len(script.requests("resume"))
        assert answered == _live_turns(store, ids)
        assert len(script.requests("resume")) < answered  # the resume did not play the tree again
        tracker = GroupTracker(store, name, n_samples_per_prompt=1)
        (group,) = tracker.poll()
        assert len(group.forks) == TREE_SIZE - 1 and all(f.status == "finished" for f in group.forks)
    finally:
        store.close()


def test_the_token_budget_stops_forking(tmp_path: Path, scripted: tuple[ScriptedEngine, TreeScript]) -> None:
    """With ``token_budget: 1`` the root alone spends it: no fork point opens, the sample is done."""
    eng, script = scripted
    script.phase = "budget"  # never holds
    home, url = tmp_path / "home", f"sqlite:///{tmp_path / 'log.db'}"
    cfg = _config(tmp_path, eng.url)
    data = yaml.safe_load(cfg.read_text())
    data["branching"]["token_budget"] = 1
    cfg.write_text(yaml.safe_dump(data))
    finish(start_worker(["--config", str(cfg), "--database-url", url], home))
    store = open_store(url, home)
    try:
        (root,) = store.sessions.list(data["run"])
        assert root.status == "finished" and root.parent_session_id is None
        assert store.tasks.counts(data["run"])["done"] == 1
        assert len(script.requests("budget")) == TURNS
    finally:
        store.close()
