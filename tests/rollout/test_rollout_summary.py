"""The end of a rollout (issue 34, point 8): ``rollout --no-progress`` still prints the summary table
(as ``loop --no-progress`` does), with the eval row; the closing hint's ``show`` names a training
session, never an eval one (eval sessions are claimed first, so the first one to finish is often
eval); the Ray driver's table has the eval row too."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dressage.cli import app
from dressage.rollout.progress import RolloutProgress
from dressage.rollout.worker import WorkerOptions
from dressage.store import EventStore, TaskSpec
from tests.log_builders import record_one_turn_session
from tests.rollout.conftest import open_store, requires_bwrap, write_config, write_tasks
from tests.rollout.test_rollout_e2e import LETTERS


@requires_bwrap
def test_no_progress_prints_the_summary_and_shows_a_training_session(
    tmp_path: Path, engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
    write_tasks(tmp_path / "eval.jsonl", LETTERS[2:4])
    cfg = write_config(
        tmp_path,
        engine_url,
        name="summary",
        n_samples_per_prompt=1,
        eval={"name": "held-out", "dataset": {"path": "eval.jsonl"}, "n_samples_per_prompt": 1},
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    args = ["rollout", "--config", str(cfg), "--no-progress", "--database-url", db]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "rollout summary" in result.stderr  # the table's title
    assert "sessions finished" in result.stderr
    assert re.search(r"held-out \(eval\)\W+v0 ", result.stderr), result.stderr
    [shown] = re.findall(r"dressage-worker show (\S+)", result.stderr)
    store = open_store(db, tmp_path / "home")
    try:
        session = store.sessions.get(shown)
        assert session.status == "finished" and session.task_id is not None
        assert store.tasks.kind_of(session.task_id)[0] == "train"
        assert any(
            s.task_id is not None and store.tasks.kind_of(s.task_id)[0] == "eval"
            for s in store.sessions.list("summary", status="finished")
        )
    finally:
        store.close()


def test_the_ray_summary_has_the_eval_row(store: EventStore, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from dressage.cluster.actors import WorkerResult
    from dressage.cluster.ray_rollout import _report

    run = store.runs.create("ray-summary", {"rollout": {"eval": {"name": "held-out"}}})
    store.tasks.enqueue(run.name, [TaskSpec(task_index=0, payload={"prompt": "eval"})], eval_version=0)
    store.tasks.enqueue(run.name, [TaskSpec(task_index=0, payload={"prompt": "train"})], n_samples=1)
    pairs = sorted(store.tasks.pairs(run.name), key=lambda p: p.kind)  # eval first, as workers claim
    for i, pair in enumerate(pairs):
        reward = 0.25 if pair.kind == "eval" else 1.0
        sid = f"ray-summary-{pair.kind}-{i}"
        record_one_turn_session(
            store, run.name, sid, task_id=pair.id, agent="a", ids=([1], [2]), version=0, reward=reward
        )
    console = Console(record=True, width=200)
    progress = RolloutProgress(store, run, console=console, enabled=False)
    opts = WorkerOptions(show_progress=False, print_summary=True)
    results = [WorkerResult("w", "node-a", "127.0.0.1", {"finished": 2})]
    report = asyncio.run(_report(store, run, progress, results, opts, console))
    out = console.export_text()
    assert "Ray workers (1 on 1 nodes)" in out
    assert re.search(r"held-out \(eval\)\W+v0 0\.250", out), out
    assert report.example_session == "ray-summary-train-1"
