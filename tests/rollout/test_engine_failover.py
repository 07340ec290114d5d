"""An engine killed with ``kill -9`` mid-run is an infrastructure fault, never a task failure.

Real ``dressage-worker rollout`` processes, real dev engine processes, the worker's own proxy:

- the quickstart, smaller (4 tasks x 4 samples, a multi-turn agent so sessions wait on the engine
  when it dies), its dev engine killed: the worker restarts it and finishes; with
  ``worker.engine_restarts: 0`` it stops, exits non-zero in one line saying how to resume, and
  ``--resume`` finishes the run. Either way every pair has exactly one finished session, none failed.
- two engines given by URL, one killed: the worker fails over to the other; no pair failed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dressage.rollout.engine_process import DevEngineProcess
from dressage.store import EventStore
from tests.rollout.conftest import REPO, open_store, requires_bwrap, start_worker

pytestmark = requires_bwrap

N_TASKS, N_SAMPLES = 4, 4
MULTI_TURN = {"kind": "python", "path": "tests.rollout.agents_for_tests:multi_turn"}
AGENT_PACE = {"DRESSAGE_TEST_AGENT_SLEEP": "0.3", "DRESSAGE_TEST_AGENT_MAX_TOKENS": "16"}
"""The multi-turn agent's pause between its calls and its replies' length (the config's
``max_tokens``): sessions stay in flight while the engine dies, and the tiny model's CPU engine
generates 16 tokens per reply instead of the agent's 64."""


def quickstart_config(tmp: Path, name: str, engine: dict[str, Any], **worker: Any) -> Path:
    """examples/quickstart.yaml, smaller: 4 tasks x 4 samples, no eval, a multi-turn agent."""
    cfg = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    letters = [row for row in (REPO / "examples" / "data" / "letters.jsonl").read_text().splitlines() if row][
        :N_TASKS
    ]
    (tmp / "tasks.jsonl").write_text("\n".join(letters) + "\n")
    cfg.pop("eval", None)
    cfg.update(run=name, dataset={"path": "tasks.jsonl"}, n_samples_per_prompt=N_SAMPLES, engine=engine)
    cfg["agent"] = MULTI_TURN
    cfg["sampling"]["max_tokens"] = 16
    cfg["worker"].update(concurrency=4, lease_s=30, poll_s=0.2, engine_probe_s=0.5, **worker)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _engine_children(pid: int) -> list[int]:
    """The dev engine processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"engine" in argv:
            found.append(int(entry.name))
    return found


def _wait_for(
    pred: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], timeout: float = 240
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"worker exited early ({proc.returncode}) while waiting for {what}:\n{out[-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def _finished(store: EventStore, name: str) -> Callable[[], bool]:
    def enough() -> bool:
        try:
            sessions = store.sessions.list(name)
        except Exception:  # the worker has not created the run yet
            return False
        return sum(s.status == "finished" for s in sessions) >= 2 and any(
            s.status == "running" for s in sessions
        )

    return enough


def _output(proc: subprocess.Popen[bytes], timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out.decode(errors="replace")


def _check_every_pair_once(store: EventStore, name: str) -> None:
    sessions = store.sessions.list(name)
    finished = Counter(s.task_id for s in sessions if s.status == "finished")
    assert len(finished) == N_TASKS * N_SAMPLES and set(finished.values()) == {1}, finished
    assert store.tasks.counts(name) == {"pending": 0, "leased": 0, "done": N_TASKS * N_SAMPLES, "failed": 0}
    assert not [s for s in sessions if s.status == "failed"]  # a dead engine fails no session


def _kill_worker_engine(
    tmp: Path, name: str, **worker: Any
) -> tuple[subprocess.Popen[bytes], str, EventStore]:
    """Start the smaller quickstart with the worker's own dev engine; kill -9 that engine mid-run."""
    home, url = tmp / "home", f"sqlite:///{tmp / 'log.db'}"
    cfg = quickstart_config(tmp, name, {"kind": "dev", "model": "tiny", "seed": 0}, **worker)
    proc = start_worker(["--config", str(cfg), "--database-url", url], home, **AGENT_PACE)
    store = open_store(url, home)
    _wait_for(_finished(store, name), "2 finished sessions and one running", proc)
    (engine_pid,) = _engine_children(proc.pid)
    os.kill(engine_pid, signal.SIGKILL)
    return proc, url, store


def test_killed_dev_engine_is_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    proc, _url, store = _kill_worker_engine(tmp_path, "engine-restart")
    try:
        out = _output(proc)
        assert proc.returncode == 0, out[-3000:]
        assert "died (exit -9); restarting it (1 of 3)" in out, out[-3000:]
        assert "is back (restart 1 of 3)" in out, out[-3000:]
        _check_every_pair_once(store, "engine-restart")
        # Interrupted attempts were continued (taken over), never counted as failures.
        for ev in store.events.read("engine-restart", kinds=("session_interrupted",)):
            assert ev.payload["failure_kind"] == "infrastructure"
    finally:
        store.close()


@pytest.mark.parametrize("resume_in_flight", [True, False], ids=["take-over", "abandon"])
def test_no_engine_left_exits_non_zero_and_resume_finishes(tmp_path: Path, resume_in_flight: bool) -> None:
    proc, url, store = _kill_worker_engine(
        tmp_path, "engine-lost", engine_restarts=0, resume_in_flight=resume_in_flight
    )
    try:
        out = _output(proc)
        assert proc.returncode == 1, out[-3000:]
        last = [line for line in out.splitlines() if line.strip()][-1]
        assert last.startswith("error: the engine at http://127.0.0.1:"), out[-3000:]
        assert "died (exit -9)" in last and "and worker.engine_restarts is 0;" in last
        assert last.endswith("resume with dressage-worker rollout --resume engine-lost"), last
        counts = store.tasks.counts("engine-lost")
        assert counts["failed"] == 0 and counts["leased"] == 0 and counts["pending"] > 0, counts
        resumed = start_worker(
            ["--resume", "engine-lost", "--database-url", url],
            tmp_path / "home",
            DRESSAGE_TEST_AGENT_MAX_TOKENS=AGENT_PACE["DRESSAGE_TEST_AGENT_MAX_TOKENS"],
        )
        out = _output(resumed)
        assert resumed.returncode == 0, out[-3000:]
        _check_every_pair_once(store, "engine-lost")
        interrupted = store.events.read("engine-lost", kinds=("session_interrupted",))
        assert interrupted and {e.payload["failure_kind"] for e in interrupted} == {"infrastructure"}
        taken_over = {e.session_id for e in store.events.read("engine-lost", kinds=("session_resumed",))}
        sessions = {s.id: s for s in store.sessions.list("engine-lost")}
        if resume_in_flight:  # each continued by a later attempt
            assert {e.session_id for e in interrupted} <= taken_over
        else:  # each kept as abandoned on infrastructure, the pair played again
            assert not taken_over
            for e in interrupted:
                s = sessions[str(e.session_id)]
                assert (s.status, s.finish_reason) == ("abandoned", "engine_unreachable")
                assert s.info["failure_kind"] == "infrastructure"
    finally:
        store.close()


@pytest.fixture
def two_engines() -> Iterator[list[DevEngineProcess]]:
    engines = [DevEngineProcess("tiny", seed=0), DevEngineProcess("tiny", seed=0)]
    try:

        async def start() -> None:
            await asyncio.gather(*(e.start() for e in engines))

        asyncio.run(start())
        yield engines
    finally:
        for e in engines:
            e.stop()


def test_two_engines_one_killed_fails_over(tmp_path: Path, two_engines: list[DevEngineProcess]) -> None:
    home, url, name = tmp_path / "home", f"sqlite:///{tmp_path / 'log.db'}", "engine-failover"
    urls = [e.url for e in two_engines]
    cfg = quickstart_config(tmp_path, name, {"kind": "sglang", "urls": urls, "model": "tiny"})
    proc = start_worker(["--config", str(cfg), "--database-url", url], home, **AGENT_PACE)
    store = open_store(url, home)
    try:
        _wait_for(_finished(store, name), "2 finished sessions and one running", proc)
        pid = two_engines[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out = _output(proc)
        assert proc.returncode == 0, out[-3000:]
        assert f"the engine at {urls[0]} died" in out and "is not this worker's to restart" in out, out[
            -3000:
        ]
        _check_every_pair_once(store, name)
        # Sessions after the death ran on the live engine only: the dead one got no new session.
        assert two_engines[0].exit_code() == -signal.SIGKILL
    finally:
        store.close()
