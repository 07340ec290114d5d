"""Ctrl-C during ``dressage-worker loop``, then ``loop --resume``, with real processes.

The loop starts its own dev engine (in its own process group), so SIGINT to the loop's group
reaches only the loop: the training step in progress ends (committed, its weights pushed: no
"engine unreachable"; an iteration played whole trains its first step), nothing more is played,
the loop exits 130 and says how to resume.
``loop --resume RUN`` continues from the last committed step and pushed version: the steps and
versions go on without a gap or a duplicate, and every (task, sample) pair of every iteration
ends with exactly one finished session. Once with SIGINT inherited as default (stopped while
training, sync), once inherited as ignored (stopped mid-rollout, async).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dressage.config import Settings
from dressage.store import EventStore
from tests.loop.test_loop import policy_versions, replay, write_config
from tests.rollout.conftest import start_command
from tests.rollout.test_crash_resume import SLOW_AGENT, _wait_for

pytestmark = pytest.mark.slow
ITERATIONS = 3


def _config(tmp: Path, mode: str) -> Path:
    """test_loop's two-task config: 3 iterations, a slow one-call agent (the rollout takes a while)."""
    path = write_config(tmp, mode)
    cfg = yaml.safe_load(path.read_text())
    cfg["agent"] = SLOW_AGENT
    cfg["loop"]["iterations"] = ITERATIONS
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start_loop(argv: list[str], tmp: Path, *, sigint_ignored: bool = False) -> subprocess.Popen[bytes]:
    url = f"sqlite:///{tmp / 'log.db'}"
    args = ["loop", "--no-progress", *argv, "--database-url", url]
    return start_command(args, tmp / "home", sigint_ignored=sigint_ignored, DRESSAGE_TEST_AGENT_SLEEP="0.5")


def _output(proc: subprocess.Popen[bytes], code: int) -> str:
    out = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == code, out[-4000:]
    return out


def _steps(store: EventStore, run: str) -> list[int]:
    return [s.step for s in store.consumers.steps(run, "train:loop")]


@pytest.mark.parametrize(("mode", "sigint"), [("sync", "default"), ("async", "ignored")])
def test_sigint_stops_a_loop_that_resume_continues(tmp_path: Path, mode: str, sigint: str) -> None:
    config = _config(tmp_path, mode)
    run = f"loop-test-{mode}"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
    proc = _start_loop(["--config", str(config)], tmp_path, sigint_ignored=sigint == "ignored")
    (tmp_path / "home").mkdir(exist_ok=True)
    store = EventStore.open(settings=settings)
    try:

        def ready() -> bool:
            try:
                counts = store.tasks.counts(run)
                steps = _steps(store, run)
            except Exception:
                return False
            if sigint == "default":  # iteration 0 played whole, its step not committed yet
                return counts["done"] >= 4 and not steps
            return 4 <= counts["done"] < 8 and counts["leased"] > 0  # iteration 1 in flight

        _wait_for(ready, 240, "the moment to interrupt", proc)
        os.killpg(proc.pid, signal.SIGINT)
        out = _output(proc, 130)
        assert f"interrupted: resume with dressage-worker loop --resume {run}" in out
        assert "error:" not in out and "unreachable" not in out, out[-4000:]
        steps_at_stop = _steps(store, run)
        assert steps_at_stop and steps_at_stop == list(range(1, len(steps_at_stop) + 1))
        # the last committed step's weights were pushed (the engine outlived the loop's stop)
        assert policy_versions(store, run) == list(range(len(steps_at_stop) + 1))

        out = _output(_start_loop(["--resume", run], tmp_path), 0)
        assert f"continuing loop {run} at iteration {len(steps_at_stop)}" in out
        assert _steps(store, run) == list(range(1, ITERATIONS + 1))  # no step twice, none missing
        assert policy_versions(store, run) == list(range(ITERATIONS + 1))
        sessions = store.sessions.list(run)
        finished = Counter(s.task_id for s in sessions if s.status == "finished")
        assert len(finished) == 2 * 2 * ITERATIONS and set(finished.values()) == {1}
        counts = store.tasks.counts(run)
        assert counts["done"] == 2 * 2 * ITERATIONS and counts["pending"] == counts["leased"] == 0
        result = replay(settings, run)  # every step re-forms bitwise from the log
        assert result.exit_code == 0, result.output
    finally:
        store.close()
        if proc.poll() is None:
            proc.kill()


def test_loop_resume_refuses_what_it_cannot_continue(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dressage.cli import app

    url = f"sqlite:///{tmp_path / 'log.db'}"
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    try:
        store.runs.create("plain", {"rollout": {"run": "plain"}})
        store.runs.create("looped", {"rollout": {"run": "looped"}, "loop": {"mode": "sync", "iterations": 2}})
    finally:
        store.close()
    runner, env = CliRunner(), {"DRESSAGE_HOME": str(tmp_path / "home")}
    result = runner.invoke(app, ["loop", "--resume", "plain", "--database-url", url], env=env)
    assert result.exit_code == 1 and "dressage-worker rollout --resume plain" in result.output
    result = runner.invoke(
        app, ["loop", "--resume", "looped", "--mode", "async", "--database-url", url], env=env
    )
    assert result.exit_code == 1 and "--mode cannot change on --resume" in result.output
    result = runner.invoke(app, ["loop", "--no-progress", "--database-url", url], env=env)
    assert result.exit_code == 1 and "give --config run.yaml (a new loop) or --resume RUN" in result.output
