"""A graceful stop of real ``dressage-worker rollout`` and ``fork`` processes, then ``--resume``.

A terminal's Ctrl-C is SIGINT to the whole foreground process group; a script's background job
inherits SIGINT as ignored. Both ways the worker must stop gracefully: exit 130, say how to resume,
hand back the leases of its in-flight sessions (``task_handed_back``), and ``--resume`` must take
those sessions over and finish every (task, sample) pair exactly once. ``dressage-worker stop RUN``
does the same through the log (exit 143).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dressage.cli import app
from dressage.rollout.stop_requests import STOP_EVENT
from dressage.store import EventStore
from tests.rollout.conftest import (
    open_store,
    requires_bwrap,
    start_worker,
    write_config,
    write_tasks,
)
from tests.rollout.fork_harness import SEED_STEP, ForkScript, finish, record_parent, start_fork
from tests.rollout.test_crash_resume import SLOW_AGENT, TASKS, _check_exactly_once, _finish, _wait_for
from tests.scripted_engine import ScriptedEngine

pytestmark = [requires_bwrap, pytest.mark.slow]


def _slow_run(tmp: Path, engine_url: str) -> tuple[Path, str]:
    """run.yaml: 6 tasks x 2 samples of a slow one-call agent, 2 at once, long leases (a resume that
    had to wait for them to expire would wait 60 s: the handed-back leases are claimable at once)."""
    write_tasks(tmp / "tasks.jsonl", TASKS)
    worker = {"concurrency": 2, "lease_s": 60, "max_attempts": 3, "resume_in_flight": True}
    cfg = write_config(tmp, engine_url, agent=SLOW_AGENT, worker=worker)
    return cfg, yaml.safe_load(cfg.read_text())["run"]


def _mid_run(store: EventStore, name: str) -> bool:
    """At least 3 sessions finished and one running."""
    try:
        sessions = store.sessions.list(name)
    except Exception:
        return False
    return sum(s.status == "finished" for s in sessions) >= 3 and any(s.status == "running" for s in sessions)


def _stopped(proc: subprocess.Popen[bytes], code: int) -> str:
    """Wait for a stopped process; its output, after checking its exit code and resume line."""
    out = proc.communicate(timeout=120)[0].decode(errors="replace")
    assert proc.returncode == code, out[-3000:]
    return out


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigint_to_the_group_stops_a_rollout_that_resume_finishes(
    tmp_path: Path, engine_url: str, sigint: str
) -> None:
    home, url = tmp_path / "home", f"sqlite:///{tmp_path / 'log.db'}"
    cfg, name = _slow_run(tmp_path, engine_url)
    proc = start_worker(
        ["--config", str(cfg), "--database-url", url],
        home,
        sigint_ignored=sigint == "ignored",
        DRESSAGE_TEST_AGENT_SLEEP="1.0",
    )
    store = open_store(url, home)
    try:
        _wait_for(lambda: _mid_run(store, name), 90, "3 finished sessions and one running", proc)
        os.killpg(proc.pid, signal.SIGINT)
        out = _stopped(proc, 130)
        assert f"interrupted: resume with dressage-worker rollout --resume {name} --database-url {url}" in out
        assert " done. Look at it with" not in out
        running = {s.id: s.task_id for s in store.sessions.list(name) if s.status == "running"}
        handed = {e.payload["task_id"] for e in store.events.read(name, kinds=("task_handed_back",))}
        # the leases of the pairs in flight (a session running, or not opened yet) were handed back
        assert handed and set(running.values()) <= handed, (running, handed)
        assert store.tasks.counts(name)["pending"] > 0

        _finish(
            start_worker(["--resume", name, "--database-url", url], home, DRESSAGE_TEST_AGENT_SLEEP="0.1")
        )
        sessions = _check_exactly_once(store, store.runs.get(name), n_pairs=12)
        assert {s.id for s in sessions if s.info.get("resume")} == set(running)  # taken over, not restarted
        assert all(s.status == "finished" for s in sessions)
    finally:
        store.close()


def test_stop_run_stops_its_workers_through_the_log(tmp_path: Path, engine_url: str) -> None:
    home, url = tmp_path / "home", f"sqlite:///{tmp_path / 'log.db'}"
    cfg, name = _slow_run(tmp_path, engine_url)
    proc = start_worker(["--config", str(cfg), "--database-url", url], home, DRESSAGE_TEST_AGENT_SLEEP="1.0")
    store = open_store(url, home)
    try:
        _wait_for(lambda: _mid_run(store, name), 90, "3 finished sessions and one running", proc)
        env = {"DRESSAGE_HOME": str(home)}
        stop = CliRunner().invoke(app, ["stop", name, "--wait", "--database-url", url], env=env)
        assert stop.exit_code == 0, stop.output
        assert "asked run" in stop.output and "stopped: no lease of the run is held" in stop.output
        out = _stopped(proc, 143)
        assert "stop requested by" in out and f"dressage-worker rollout --resume {name}" in out
        (request,) = store.events.read(name, kinds=(STOP_EVENT,))
        assert request.payload["by"].endswith(f":{os.getpid()}")

        # the request is history to a worker started after it: --resume runs to the end
        _finish(
            start_worker(["--resume", name, "--database-url", url], home, DRESSAGE_TEST_AGENT_SLEEP="0.1")
        )
        _check_exactly_once(store, store.runs.get(name), n_pairs=12)
        unknown = CliRunner().invoke(app, ["stop", "no-such-run", "--database-url", url], env=env)
        assert unknown.exit_code == 1 and "no-such-run" in unknown.output
    finally:
        store.close()


@pytest.fixture
def fork_engine() -> Iterator[tuple[ScriptedEngine, ForkScript]]:
    script = ForkScript()
    with ScriptedEngine(script).running() as eng:
        yield eng, script


def test_sigint_stops_a_fork_that_resume_finishes(
    tmp_path: Path, fork_engine: tuple[ScriptedEngine, ForkScript]
) -> None:
    eng, script = fork_engine
    url = f"sqlite:///{tmp_path / 'log.db'}"
    run, parent_id = record_parent(tmp_path, url, eng.url)
    home = tmp_path / "home"
    args = [parent_id, "--at-turn", str(SEED_STEP), "--branches", "3", "--seed", "300", "--database-url", url]
    script.phase, script.hold = "first", (4, 301)
    proc = start_fork(args, home, sigint_ignored=True)
    try:
        assert script.reached.wait(120), finish(proc)
        os.killpg(proc.pid, signal.SIGINT)
        # the held request is released only once the fork stopped: it stopped without waiting for it
        out = _stopped(proc, 130)
    finally:
        script.phase = "dead"
        script.release.set()
    script.settle()
    script.phase = "resume"
    resume_line = (
        f"interrupted: resume with dressage-worker fork {' '.join(args[:7])} --resume --database-url {url}"
    )
    assert resume_line in out, out[-2000:]
    store = open_store(url, home)
    try:
        children = [s for s in store.sessions.list(run) if s.parent_session_id == parent_id]
        assert children and any(c.status == "running" for c in children)
        finish(start_fork([*args, "--resume"], home))
        children = [s for s in store.sessions.list(run) if s.parent_session_id == parent_id]
        assert len(children) == 3 and {c.status for c in children} == {"finished"}
        finals = Counter(e.session_id for e in store.events.read(run, kinds=("session_finalized",)))
        assert all(finals[c.id] == 1 for c in children)
    finally:
        store.close()
