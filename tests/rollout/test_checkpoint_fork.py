"""Forks and take-overs from sandbox checkpoints, with real worker processes (every test on SQLite and
PostgreSQL).

A coding agent (bwrap sandbox) runs a 6-turn tool loop through a scripted engine; every tool call
prints a nanosecond clock and random bytes (so replaying the tools could never reproduce a
prompt) and appends its step to ``calls.txt`` (the sandbox's tool-call counter). The run takes a
checkpoint at each turn. A fork at turn 3 into 3 branches starts each branch from the parent's
checkpoint at 3: the shared turns are the parent's id for id, the workspace at 3 is the parent's
byte for byte, and nothing before turn 3 runs again (0 engine requests, 0 tool calls). A worker
killed with ``kill -9`` at turn 4 is resumed from its checkpoint at 4 the same way. An agent without
a resume entry point falls back to replay, and its branch says why.
"""

from __future__ import annotations

import io
import os
import signal
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from dressage.paddock.checkpoints import Manifest
from dressage.store import EventStore
from dressage.store.db import make_engine
from tests.paddock.images import BuiltImage
from tests.rollout.conftest import open_store, requires_bwrap, start_worker
from tests.rollout.fork_harness import ForkScript, finish, parent_config, start_fork, turn_rows
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

pytestmark = requires_bwrap
TURNS = 6
K = 3
BRANCHES = 3
SEED = 100
CHECKPOINTS = {"keep": "all"}


def command(step: int, seed: object) -> str:
    """Step ``step``'s tool call: count it, print a nanosecond clock and random bytes."""
    tag = "shared" if step < K else f"seed{seed}"
    return (
        f"echo call{step}-{tag} >> calls.txt && date +%N >> log.txt && "
        f"head -c8 /dev/urandom | od -x >> log.txt && tail -n 3 log.txt"
    )


@dataclass
class ClockScript:
    """The engine's policy: one such tool call per step; counts requests by (phase, step, seed)."""

    phase: str = "parent"
    tool: Callable[[int, object], str] = command
    hold: tuple[str, int] | None = None
    calls: list[tuple[str, int, object]] = field(default_factory=list)
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        step = prompt.count("<tool_response>")
        seed = sampling.get("sampling_seed")
        self.calls.append((self.phase, step, seed))
        if self.hold == (self.phase, step) and not self.release.is_set():
            self.reached.set()
            self.release.wait(120)
        return qwen_tool_call("shell_exec", cmd=self.tool(step, seed))

    def steps(self, phase: str) -> list[int]:
        """The steps of the engine requests of ``phase``."""
        return [step for p, step, _ in self.calls if p == phase]


@pytest.fixture
def clock() -> Iterator[tuple[ScriptedEngine, ClockScript]]:
    script = ClockScript()
    with ScriptedEngine(script).running() as eng:
        yield eng, script


def _workspace_file(store: EventStore, run: str, session_id: str, name: str) -> str:
    """A file of the session's archived workspace (``workspace.tar.gz``)."""
    (ref,) = [a for a in store.artifacts.list(run, session_id=session_id) if a.name == "workspace.tar.gz"]
    with tarfile.open(fileobj=io.BytesIO(store.artifacts.get(ref)), mode="r:gz") as tar:
        member = tar.extractfile(f"./{name}")
        assert member is not None
        return member.read().decode()


def _changes(db_url: str, session_id: str) -> dict[tuple[int, str], str]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT turn_index, path, change FROM workspace_changes WHERE session_id = :s"),
                {"s": session_id},
            )
            return {(int(r[0]), str(r[1])): str(r[2]) for r in rows}
    finally:
        engine.dispose()


def _record_parent(
    tmp: Path, db_url: str, engine_url: str, checkpoints: Mapping[str, Any] = CHECKPOINTS, **sections: Any
) -> tuple[str, str]:
    cfg = parent_config(tmp, engine_url, checkpoints=dict(checkpoints), **sections)
    finish(start_worker(["--config", str(cfg), "--database-url", db_url], tmp / "home"))
    name = yaml.safe_load(cfg.read_text())["run"]
    store = open_store(db_url, tmp / "home")
    try:
        (session,) = store.sessions.list(name, status="finished")
        return name, session.id
    finally:
        store.close()


def test_fork_from_the_checkpoint_at_turn_3(
    tmp_path: Path, any_db_url: str, clock: tuple[ScriptedEngine, ClockScript]
) -> None:
    eng, script = clock
    run, parent_id = _record_parent(tmp_path, any_db_url, eng.url)
    assert script.steps("parent") == list(range(TURNS))
    changes = _changes(any_db_url, parent_id)
    assert changes[(1, "workspace/calls.txt")] == "added"
    assert changes[(2, "workspace/calls.txt")] == "modified"
    assert [k for k in changes if k[0] == 0] == [(0, "workspace")]  # the first: all added (an empty folder)

    script.phase = "fork"
    args = [parent_id, "--at-turn", str(K), "--branches", str(BRANCHES), "--seed", str(SEED)]
    out = finish(start_fork([*args, "--database-url", any_db_url], tmp_path / "home"))
    assert f"{BRANCHES} branches" in out
    # No engine request before turn K: one per branch and live step.
    assert sorted(script.steps("fork")) == sorted(list(range(K, TURNS)) * BRANCHES)

    store = open_store(any_db_url, tmp_path / "home")
    try:
        assert [c.turn_index for c in store.sandbox_checkpoints.by_session(parent_id)] == list(range(TURNS))
        parent_at_k = store.sandbox_checkpoints.get(parent_id, K)
        assert parent_at_k is not None
        parent = turn_rows(store, parent_id)
        parent_calls = _workspace_file(store, run, parent_id, "calls.txt").splitlines()
        assert parent_calls[:K] == [f"call{k}-shared" for k in range(K)]
        children = store.sessions.children(parent_id)
        assert len(children) == BRANCHES
        for child in children:
            assert (child.status, child.fork_turn) == ("finished", K)
            start = child.info["start"]
            assert (start["path"], start["turn"]) == ("checkpoint", K)
            rows = turn_rows(store, child.id)
            assert len(rows) == TURNS
            assert rows[:K] == parent[:K]  # id for id, placement included
            assert rows[K][1:4] == parent[K][1:4]  # turn K appends to the shared segment
            assert rows[K][6] == parent[K][6]  # its prompt is the parent's request at K, token for token
            # The workspace at K is the parent's byte for byte: its checkpoint's manifest is the same.
            own_at_k = store.sandbox_checkpoints.get(child.id, K)
            assert own_at_k is not None and own_at_k.manifest_sha256 == parent_at_k.manifest_sha256
            assert store.sandbox_checkpoints.changes(child.id, K) == []
            # 0 tool calls before K: the restored counter holds steps 0..K-1 once, then the branch's own.
            seed = child.info["fork"]["seed"]
            calls = _workspace_file(store, run, child.id, "calls.txt").splitlines()
            assert calls == parent_calls[:K] + [f"call{k}-seed{seed}" for k in range(K, TURNS)]
    finally:
        store.close()


def _wait_for_checkpoint(store: EventStore, run: str, turn: int, limit_s: float = 60) -> str:
    """The running session once its checkpoint at ``turn`` is recorded (polled)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        running = store.sessions.list(run, status="running")
        if running and store.sandbox_checkpoints.get(running[0].id, turn) is not None:
            return running[0].id
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at turn {turn} within {limit_s}s")


def _kill_9_and_resume(
    tmp_path: Path, db_url: str, clock: tuple[ScriptedEngine, ClockScript], hold: int, **sections: Any
) -> tuple[EventStore, str, str]:
    """Run the 6-turn session, kill its worker with ``kill -9`` once its checkpoint at ``hold`` is
    recorded (the engine holds request ``hold``), resume the run; checks what every provider must
    hold and returns the open store, the run and the session."""
    eng, script = clock
    script.phase, script.hold = "first", ("first", hold)
    home = tmp_path / "home"
    worker = {"concurrency": 1, "lease_s": 3, "max_attempts": 3, "session_timeout_s": 120}
    cfg = parent_config(tmp_path, eng.url, checkpoints=CHECKPOINTS, worker=worker, **sections)
    run = yaml.safe_load(cfg.read_text())["run"]
    proc = start_worker(["--config", str(cfg), "--database-url", db_url], home)
    store = open_store(db_url, home)
    try:
        try:
            assert script.reached.wait(120), f"the worker never reached step {hold}"
            sid = _wait_for_checkpoint(store, run, hold)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            script.phase = "resume"
            script.release.set()
        before = turn_rows(store, sid)
        assert len(before) == hold
        finish(start_worker(["--resume", run, "--database-url", db_url], home))

        assert script.steps("resume") == list(range(hold, TURNS))  # 0 requests, 0 tokens before hold
        (session,) = store.sessions.list(run)
        assert (session.status, session.attempt) == ("finished", 2)
        start = session.info["start"]
        assert (start["path"], start["turn"]) == ("checkpoint", hold)
        assert session.info["replay"]["turns_replayed"] == 0
        assert session.info["replay"]["outcome"] == "completed"
        after = turn_rows(store, sid)
        assert after[:hold] == before  # the recorded prefix
        assert len(after) == TURNS and {r[1] for r in after} == {0}  # + live continuation, one segment
        assert after[hold][3] == "append"
        calls = _workspace_file(store, run, sid, "calls.txt").splitlines()
        assert [c.split("-")[0] for c in calls] == [f"call{k}" for k in range(TURNS)]  # none repeated
        return store, run, sid
    except BaseException:
        store.close()
        raise


@pytest.mark.slow  # a crash drill, as tests/rollout/test_inflight_resume.py
def test_kill_9_at_turn_4_resumes_from_its_checkpoint(
    tmp_path: Path, any_db_url: str, clock: tuple[ScriptedEngine, ClockScript]
) -> None:
    store, _, _ = _kill_9_and_resume(tmp_path, any_db_url, clock, hold=4)
    store.close()


@pytest.mark.parametrize(
    ("agent_class", "why"),
    [
        ("NoResumeCodingAgent", "has no resume entry point"),
        ("MisremembersCodingAgent", "checkpoint diverged at turn 3"),
    ],
)
def test_fork_falls_back_to_replay(tmp_path: Path, any_db_url: str, agent_class: str, why: str) -> None:
    """An agent without resume replays from the start; one whose resumed request differs from the
    recorded one is refused at turn K and its branch is taken over to replay. Both say why."""
    script = ForkScript()  # deterministic tools: a replayed branch rebuilds the parent's workspace
    agent = {
        "kind": "python",
        "path": f"tests.rollout.agents_for_tests:{agent_class}",
        "options": {"max_turns": TURNS},
    }
    with ScriptedEngine(script).running() as eng:
        run, parent_id = _record_parent(tmp_path, any_db_url, eng.url, agent=agent)
        script.phase = "fork"
        finish(start_fork([parent_id, "--at-turn", str(K), "--database-url", any_db_url], tmp_path / "home"))
    assert all(step >= K for step, _ in script.requests("fork"))
    store = open_store(any_db_url, tmp_path / "home")
    try:
        assert store.sandbox_checkpoints.get(parent_id, K) is not None  # there was one to start from
        (child,) = store.sessions.children(parent_id)
        assert child.status == "finished"
        start = child.info["start"]
        assert start["path"] == "replay"
        assert why in start["why"]
        diverged = store.events.read(run, kinds=("checkpoint_diverged",))
        assert [e.session_id for e in diverged] == (
            [child.id] if agent_class == "MisremembersCodingAgent" else []
        )
        turns = store.turns.read(session_id=child.id, with_experts=False)
        assert turn_rows(store, child.id)[:K] == turn_rows(store, parent_id)[:K]
        assert all("replayed_from" in t.info for t in turns[:K])
    finally:
        store.close()


def image_command(step: int, seed: object) -> str:
    """:func:`command`, also counting the call in the image's ``/etc`` and deleting an image file at 1."""
    tag = "shared" if step < K else f"seed{seed}"
    image = f"echo call{step}-{tag} >> /etc/calls.txt && " + ("rm /opt/lower.txt && " if step == 1 else "")
    return image + command(step, seed)


def _manifest(store: EventStore, session_id: str, turn: int) -> Manifest:
    found = store.sandbox_checkpoints.get(session_id, turn)
    assert found is not None, (session_id, turn)
    return Manifest.from_bytes(store.sandbox_checkpoints.read_manifest(found))


def test_fork_from_the_checkpoint_on_the_image_provider(
    tmp_path: Path, any_db_url: str, test_image: BuiltImage, clock: tuple[ScriptedEngine, ClockScript]
) -> None:
    """The same fork on provider ``image``: what the tools wrote into the image's ``/etc`` and the
    image file they deleted are restored from the checkpoint with the workspace (0 calls before K)."""
    eng, script = clock
    script.tool = image_command
    db_url = any_db_url
    sandbox = {"provider": "image", "image": test_image.oci}
    run, parent_id = _record_parent(tmp_path, db_url, eng.url, sandbox=sandbox)
    changes = _changes(db_url, parent_id)
    assert changes[(1, "image/etc/calls.txt")] == "added" and changes[(2, "image/opt/lower.txt")] == "added"

    script.phase = "fork"
    args = [parent_id, "--at-turn", str(K), "--branches", "2", "--seed", str(SEED)]
    finish(start_fork([*args, "--database-url", db_url], tmp_path / "home"))
    assert sorted(script.steps("fork")) == sorted(list(range(K, TURNS)) * 2)
    store = open_store(db_url, tmp_path / "home")
    try:
        parent_at_k = _manifest(store, parent_id, K)
        assert parent_at_k.by_path()["image/opt/lower.txt"].kind == "deleted"
        for child in store.sessions.children(parent_id):
            assert (child.status, child.info["start"]["path"]) == ("finished", "checkpoint")
            assert _manifest(store, child.id, K).sha256 == parent_at_k.sha256  # restored byte for byte
            last = _manifest(store, child.id, TURNS - 1)
            assert last.by_path()["image/opt/lower.txt"].kind == "deleted"
            etc = last.by_path()["image/etc/calls.txt"]
            assert store.artifacts.blobs is not None and etc.sha256 is not None
            lines = store.artifacts.blobs.get(last.blobs[etc.sha256]).decode().splitlines()
            seed = child.info["fork"]["seed"]
            assert lines == [f"call{k}-shared" for k in range(K)] + [
                f"call{k}-seed{seed}" for k in range(K, TURNS - 1)
            ]
            calls = _workspace_file(store, run, child.id, "calls.txt").splitlines()
            assert calls[:K] == [f"call{k}-shared" for k in range(K)] and len(calls) == TURNS
    finally:
        store.close()


@pytest.mark.slow  # a crash drill on an image sandbox
def test_kill_9_on_the_image_provider_resumes_from_its_checkpoint(
    tmp_path: Path, any_db_url: str, test_image: BuiltImage, clock: tuple[ScriptedEngine, ClockScript]
) -> None:
    """The take-over on provider ``image``: the session killed at turn 4 resumes from its checkpoint,
    the image's ``/etc`` and its deleted file restored with the workspace; no tool call runs twice
    (the workspace's and ``/etc``'s counters) and no engine request is made for turns 0..3."""
    _, script = clock
    script.tool = image_command
    hold = 4
    sandbox = {"provider": "image", "image": test_image.oci}
    store, _, sid = _kill_9_and_resume(tmp_path, any_db_url, clock, hold=hold, sandbox=sandbox)
    try:
        at_hold = _manifest(store, sid, hold)
        assert at_hold.by_path()["image"].kind == "overlay"
        assert at_hold.by_path()["image/opt/lower.txt"].kind == "deleted"
        last = _manifest(store, sid, TURNS - 1)  # taken by the second attempt, over the restored sandbox
        assert last.by_path()["image/opt/lower.txt"].kind == "deleted"
        etc = last.by_path()["image/etc/calls.txt"]
        assert store.artifacts.blobs is not None and etc.sha256 is not None
        lines = store.artifacts.blobs.get(last.blobs[etc.sha256]).decode().splitlines()
        assert [line.split("-")[0] for line in lines] == [
            f"call{k}" for k in range(TURNS - 1)
        ]  # none repeated
    finally:
        store.close()


def test_fork_from_the_checkpoint_on_e2b(
    tmp_path: Path,
    any_db_url: str,
    clock: tuple[ScriptedEngine, ClockScript],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same fork on provider ``e2b`` against the fake at E2B's wire protocol: each checkpoint is a
    snapshot, and each branch's VM is started from the parent's snapshot at K (0 calls before K)."""
    from tests.paddock.fake_e2b import FakeE2B

    eng, script = clock
    with FakeE2B() as fake:
        for k, v in {"E2B_API_KEY": "e2b_fake", "E2B_API_URL": fake.url, "E2B_SANDBOX_URL": fake.url}.items():
            monkeypatch.setenv(k, v)
        db_url = any_db_url
        run, parent_id = _record_parent(tmp_path, db_url, eng.url, sandbox={"provider": "e2b"})
        script.phase = "fork"
        args = [parent_id, "--at-turn", str(K), "--branches", "2", "--seed", str(SEED)]
        finish(start_fork([*args, "--database-url", db_url], tmp_path / "home"))
        assert sorted(script.steps("fork")) == sorted(list(range(K, TURNS)) * 2)
        store = open_store(db_url, tmp_path / "home")
        try:
            (snapshot,) = _manifest(store, parent_id, K).entries
            assert snapshot.kind == "snapshot" and snapshot.target in fake.state.snapshots
            started = [c for c in fake.state.created if c.get("templateID") == snapshot.target]
            assert len(started) == 2  # one VM per branch, from the parent's snapshot at K
            parent_calls = _workspace_file(store, run, parent_id, "calls.txt").splitlines()
            for child in store.sessions.children(parent_id):
                assert (child.status, child.info["start"]["path"]) == ("finished", "checkpoint")
                seed = child.info["fork"]["seed"]
                calls = _workspace_file(store, run, child.id, "calls.txt").splitlines()
                assert calls == parent_calls[:K] + [f"call{k}-seed{seed}" for k in range(K, TURNS)]
        finally:
            store.close()


def test_e2b_retention_deletes_the_pruned_snapshots(
    tmp_path: Path,
    any_db_url: str,
    clock: tuple[ScriptedEngine, ClockScript],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``keep: last:2`` on e2b: the log keeps two checkpoints, and E2B (the fake) only their snapshots."""
    from tests.paddock.fake_e2b import FakeE2B

    eng, _ = clock
    with FakeE2B() as fake:
        for k, v in {"E2B_API_KEY": "e2b_fake", "E2B_API_URL": fake.url, "E2B_SANDBOX_URL": fake.url}.items():
            monkeypatch.setenv(k, v)
        db_url = any_db_url
        keep = {"keep": "last:2"}
        _, sid = _record_parent(tmp_path, db_url, eng.url, checkpoints=keep, sandbox={"provider": "e2b"})
        store = open_store(db_url, tmp_path / "home")
        try:
            kept = [c.turn_index for c in store.sandbox_checkpoints.by_session(sid)]
            assert kept == [TURNS - 2, TURNS - 1]
            snapshots = {_manifest(store, sid, k).entries[0].target for k in kept}
            assert len(fake.state.snapshot_requests) == TURNS  # one taken per turn
            assert set(fake.state.snapshots) == snapshots  # the four pruned ones deleted
        finally:
            store.close()
