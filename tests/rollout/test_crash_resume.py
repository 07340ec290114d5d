"""Crash resume and cooperating workers, with real `dressage-worker rollout` processes.

- kill -9 a worker mid-run; its leases (3 s) expire; `--resume RUN` finishes the run: every
  (task, sample) has exactly one finished session, and nothing is counted twice. With
  ``resume_in_flight`` off the killed worker's in-flight sessions are kept as ``abandoned``; with it
  on (the default) the next attempt continues them (see also ``test_inflight_resume.py``).
- two workers on one PostgreSQL run: both work, no task is done twice.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.rollout.conftest import open_store, requires_bwrap, start_worker, write_config, write_tasks

pytestmark = requires_bwrap

TASKS = [{"prompt": f"Task {i}: say '{c}'.", "label": c} for i, c in enumerate("eatosn")]
SLOW_AGENT = {"kind": "python", "path": "tests.rollout.agents_for_tests:slow_answer"}


def _wait_for(pred, timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"worker exited early ({proc.returncode}) while waiting for {what}:\n{out[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _finish(proc, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def _check_exactly_once(store, run, n_pairs: int) -> list:
    sessions = store.sessions.list(run)
    finished = Counter(s.task_id for s in sessions if s.status == "finished")
    assert len(finished) == n_pairs and set(finished.values()) == {1}, finished
    assert store.tasks.counts(run) == {"pending": 0, "leased": 0, "done": n_pairs, "failed": 0}
    # One reward event per finished session, none for abandoned ones.
    rewards = Counter(e.session_id for e in store.events.read(run, kinds=("reward",), limit=100_000))
    assert {s.id for s in sessions if s.status == "finished"} <= set(rewards) and set(rewards.values()) == {1}
    return sessions


def test_kill_9_mid_run_then_resume(tmp_path: Path, any_db_url: str, engine_url: str) -> None:
    # Both claim paths, one per backend (each run is slow): abandon-and-restart on SQLite, in-flight
    # resume on PostgreSQL (test_inflight_resume.py covers resume on both, token for token).
    resume_in_flight = not any_db_url.startswith("sqlite")
    home = tmp_path / "home"
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    worker = {"concurrency": 2, "lease_s": 3, "max_attempts": 5, "resume_in_flight": resume_in_flight}
    cfg = write_config(tmp_path, engine_url, agent=SLOW_AGENT, worker=worker)
    proc = start_worker(
        ["--config", str(cfg), "--database-url", any_db_url], home, DRESSAGE_TEST_AGENT_SLEEP="1.0"
    )
    store = open_store(any_db_url, home)
    import yaml

    name = yaml.safe_load(cfg.read_text())["run"]

    def progressed() -> bool:
        try:
            sessions = store.sessions.list(name)
        except Exception:
            return False
        return sum(s.status == "finished" for s in sessions) >= 3 and any(
            s.status == "running" for s in sessions
        )

    _wait_for(progressed, 90, "3 finished sessions and one running", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    run = store.runs.get(name)
    running_at_kill = {s.id for s in store.sessions.list(run) if s.status == "running"}
    assert running_at_kill and store.tasks.counts(run)["leased"] >= 1

    resumed = start_worker(
        ["--resume", name, "--database-url", any_db_url], home, DRESSAGE_TEST_AGENT_SLEEP="0.1"
    )
    _finish(resumed)
    sessions = _check_exactly_once(store, run, n_pairs=12)
    abandoned = {s.id for s in sessions if s.status == "abandoned"}
    if resume_in_flight:  # continued by the next attempt: finished, nothing abandoned
        assert not abandoned and len(sessions) == 12
        resumed = {s.id for s in sessions if s.info.get("resume")}
        assert resumed == running_at_kill and all(s.status == "finished" for s in sessions)
    else:
        assert abandoned == running_at_kill  # kept for audit, never finished
        assert all(s.finish_reason == "lease_expired" for s in sessions if s.id in abandoned)
    store.close()


def test_two_workers_share_one_postgres_run(tmp_path: Path, rollout_pg_url: str, engine_url: str) -> None:
    home = tmp_path / "home"
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    cfg = write_config(tmp_path, engine_url, agent=SLOW_AGENT, worker={"concurrency": 2})
    args = ["--config", str(cfg), "--database-url", rollout_pg_url]
    a = start_worker([*args, "--worker-id", "worker-a"], home, DRESSAGE_TEST_AGENT_SLEEP="0.3")
    b = start_worker([*args, "--worker-id", "worker-b"], home, DRESSAGE_TEST_AGENT_SLEEP="0.3")
    _finish(a)
    _finish(b)
    import yaml

    store = open_store(rollout_pg_url, home)
    run = store.runs.get(yaml.safe_load(cfg.read_text())["run"])
    sessions = _check_exactly_once(store, run, n_pairs=12)
    assert len(sessions) == 12  # no duplicate attempt anywhere
    owners = Counter(e.payload["owner"] for e in store.events.read(run, kinds=("task_claimed",)))
    assert set(owners) == {"worker-a", "worker-b"} and sum(owners.values()) == 12
    store.close()
