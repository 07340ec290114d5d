"""``dressage-worker loop``: rollout -> train -> push -> rollout on a real dev engine, proxy and SQLite log.

Tiny settings (2 tasks x 2 samples, 4 tokens) keep each loop to a few seconds of rollout; the
assertions are about what the log and the engine must show, never about reward values.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from sqlalchemy import text
from typer.testing import CliRunner

from dressage.cli import app
from dressage.config import Settings
from dressage.engines.sglang_client import EngineClient
from dressage.errors import ConfigError, TrainingError
from dressage.loop.runner import Loop, LoopOptions
from dressage.rollout.evaluation import read_eval_rounds
from dressage.store import EventStore
from dressage.store.views import REFERENCE_STEP_METRICS, STEP_METRIC_COLUMNS
from tests.loop_driver import drive_loop


def write_config(tmp: Path, mode: str, train: dict[str, Any] | None = None) -> Path:
    """A two-task run.yaml for the local sandbox, with train:/loop: sections."""
    (tmp / "tasks.jsonl").write_text(
        '{"prompt": "Say a word with the letter e.", "label": "e"}\n'
        '{"prompt": "Say a word with the letter a.", "label": "a"}\n'
    )
    cfg: dict[str, Any] = {
        "run": "loop-test",
        "dataset": {"path": "tasks.jsonl"},
        "n_samples_per_prompt": 2,
        "engine": {"kind": "dev", "model": "tiny", "seed": 0},
        "sampling": {"max_tokens": 4, "enable_thinking": False},
        "agent": {"kind": "answer"},
        "sandbox": {"provider": "local", "timeout_s": 20},
        "reward": {"kind": "contains"},
        "worker": {"concurrency": 4, "lease_s": 30, "session_timeout_s": 60, "poll_s": 0.1},
        "train": {"lr": 1.0, **(train or {})},
        "loop": {"iterations": 2, "mode": mode},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def policy_versions(store: EventStore, run: str) -> list[int]:
    """The run's recorded policy versions, in log order."""
    return [e.payload["version"] for e in store.events.read(run, kinds=("policy_version",))]


def token_versions(store: EventStore, run: str, min_task_index: int) -> list[int]:
    """Per-token policy versions (``token_events``) of sessions of tasks >= ``min_task_index``."""
    sql = text(
        "SELECT te.policy_version FROM token_events te JOIN sessions s ON s.id = te.session_id "
        "JOIN tasks k ON k.id = s.task_id WHERE te.run_name = :run AND k.task_index >= :i "
        "AND te.policy_version IS NOT NULL"
    )
    with store.db.engine.connect() as conn:
        return [int(r[0]) for r in conn.execute(sql, {"run": run, "i": min_task_index})]


def drive(tmp: Path, mode: str, train: dict[str, Any] | None = None) -> tuple[Loop, str | None, Settings]:
    """Run a 2-iteration loop; return it (stopped) and the engine's weight version before the stop."""
    settings = Settings(database_url=f"sqlite:///{tmp / 'log.db'}", home=tmp / "home")
    store = EventStore.open(settings=settings)
    config = write_config(tmp, mode, train)

    async def engine_version(loop: Loop) -> str | None:
        await asyncio.to_thread(loop.refresh_versions)
        assert loop.engine is not None
        async with EngineClient(loop.engine.url) as client:
            return (await client.model_info()).weight_version

    loop, version = drive_loop(store, settings, config, tmp / "out", on_done=engine_version)
    return loop, version, settings


def replay(settings: Settings, run: str) -> Any:
    """``dressage-worker train --from-run RUN --consumer loop --replay``."""
    url = settings.resolved_database_url()
    args = ["train", "--from-run", run, "--consumer", "loop", "--replay", "--database-url", url]
    return CliRunner().invoke(app, args)


def test_sync_loop_pushes_versions_and_trains_each_iteration(tmp_path: Path) -> None:
    loop, engine_version, settings = drive(tmp_path, "sync")
    store, run = loop.store, loop.run_name
    try:
        assert run == "loop-test-sync"
        assert store.runs.get(run).config["sandbox_limits"] == "none"  # the local sandbox enforces none
        assert policy_versions(store, run) == [0, 1, 2]
        assert engine_version == "2"  # the engine serves the weights of the last push
        assert [s.versions for s in loop.stats] == [(0,), (1,)]  # sync: iteration k sampled by policy k
        assert [s.finished for s in loop.stats] == [4, 4]
        assert min(token_versions(store, run, min_task_index=2)) >= 1  # iteration 1 = task indexes 2, 3
        assert set(token_versions(store, run, min_task_index=0)) == {0, 1}
        ckpt = store.consumers.checkpoint(run, "train:loop")
        assert ckpt is not None and ckpt.step == 2
        steps = store.consumers.steps(run, "train:loop")
        assert [s.manifest["trainer_version"] for s in steps] == [0, 1]
        groups = [sorted(g["task_index"] for g in s.manifest["groups"]) for s in steps]
        assert groups == [[0, 1], [2, 3]]  # each step trained on its own iteration's groups
        assert (tmp_path / "out" / "step-000002.safetensors").is_file()
        result = replay(settings, run)
        assert result.exit_code == 0, result.output
        assert "every batch hash matches" in result.output
    finally:
        store.close()


def test_async_loop_records_versions_per_token(tmp_path: Path) -> None:
    # max_staleness 0: step 2 (trainer version 1) masks every iteration-1 token still sampled by
    # policy 0 (how many there are depends on timing; the manifest must account for each one)
    try:
        loop, engine_version, settings = drive(tmp_path, "async", {"max_staleness": 0})
    except TrainingError as e:
        # a busy machine: iteration 1 ended before the push, so step 2 would train nothing: the
        # loop stops saying so instead of committing an empty step (docs/training.md)
        settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
        store = EventStore.open(settings=settings)
        try:
            assert set(token_versions(store, "loop-test-async", min_task_index=2)) == {0}
            assert str(e).startswith("step 2 would train 0 tokens: ") and "max_staleness 0" in str(e)
            assert len(store.consumers.steps("loop-test-async", "train:loop")) == 1
        finally:
            store.close()
        return
    store, run = loop.store, loop.run_name
    try:
        assert policy_versions(store, run) == [0, 1, 2] and engine_version == "2"
        # iteration 1 rolled out while iteration 0 trained: its tokens carry version 0 or 1
        iteration1 = token_versions(store, run, min_task_index=2)
        assert set(iteration1) <= {0, 1}
        log_versions: dict[tuple[str, int], list[int]] = {}
        for turn in store.turns.read(run, with_experts=False):
            v = turn.policy_versions[turn.policy_versions >= 0]
            assert (v[1:] >= v[:-1]).all(), "a turn's versions only grow across a pause/resume"
            log_versions.setdefault((turn.session_id, turn.segment_index), []).extend(v.tolist())
        steps = store.consumers.steps(run, "train:loop")
        assert len(steps) == 2 and steps[1].manifest["options"]["masking"]["max_staleness"] == 0
        masked = []
        for step in steps:
            trainer_version = step.manifest["trainer_version"]
            masked.append(0)
            for entry in step.manifest["samples"]:
                versions = log_versions[(entry["session"], entry["segment"])]
                assert entry["versions"] == {str(v): versions.count(v) for v in sorted(set(versions))}
                stale = sum(1 for v in versions if v < trainer_version)
                m = entry["masking"]
                assert m["recorded_trainable"] == len(versions)
                assert (m["masked_stale"], m["trainable"]) == (stale, len(versions) - stale)
                masked[-1] += m["masked_stale"]
        assert masked == [0, iteration1.count(0)]
        result = replay(settings, run)
        assert result.exit_code == 0, result.output
    finally:
        store.close()


def test_a_loop_refuses_an_existing_run(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
    store = EventStore.open(settings=settings)
    try:
        store.runs.create("loop-test-sync")
        loop = Loop(store, settings, LoopOptions(str(write_config(tmp_path, "sync"))), Console())
        with pytest.raises(ConfigError, match="already exists"):
            asyncio.run(loop.start())
        with pytest.raises(ConfigError, match="must divide"):
            cfg = write_config(tmp_path, "sync")
            data = yaml.safe_load(cfg.read_text())
            data["train"]["global_batch_size"] = 3
            cfg.write_text(yaml.safe_dump(data))
            Loop(store, settings, LoopOptions(str(cfg)), Console())
    finally:
        store.close()


@pytest.mark.timeout(600)  # one iteration plus two eval rounds; the shared CI machines can be slow
def test_the_loop_evaluates_each_policy_version(tmp_path: Path) -> None:
    config = write_config(tmp_path, "sync")
    data = yaml.safe_load(config.read_text())
    (tmp_path / "eval.jsonl").write_text(
        '{"prompt": "Say a word with the letter o.", "label": "o"}\n'
        '{"prompt": "Say a word with the letter i.", "label": "i"}\n'
    )
    data["eval"] = {"name": "held-out", "dataset": {"path": "eval.jsonl"}}
    config.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'log.db'}"
    plot = tmp_path / "reward.png"
    args = [
        "loop",
        "--config",
        str(config),
        "-k",
        "1",
        "--no-progress",
        "--plot",
        str(plot),
        "--database-url",
        url,
    ]
    result = CliRunner().invoke(app, args, env={"DRESSAGE_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("held-out reward per policy version"))
    assert [v.split()[0] for v in line.split(": ", 1)[1].split(", ")] == ["v0", "v1"]
    assert "done)" not in line  # every round complete
    assert plot.is_file() and plot.stat().st_size > 0
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    try:
        run = "loop-test-sync"
        rounds = read_eval_rounds(store, run)
        assert [(r.version, r.complete, len(r.sessions)) for r in rounds] == [(0, True, 2), (1, True, 2)]
        # each round was sampled by the policy it evaluates, and is marked in the log and the views
        sql = text(
            "SELECT k.eval_version, te.policy_version FROM token_events te "
            "JOIN sessions s ON s.id = te.session_id JOIN tasks k ON k.id = s.task_id "
            "WHERE k.kind = 'eval' AND te.policy_version IS NOT NULL"
        )
        counts = text(
            "SELECT kind, COUNT(*) FROM trajectories WHERE run_name = :r GROUP BY kind ORDER BY kind"
        )
        with store.db.engine.connect() as conn:
            pairs = conn.execute(sql).all()
            kinds = [tuple(r) for r in conn.execute(counts, {"r": run})]
        assert pairs and all(v == pv for v, pv in pairs)
        assert kinds == [("eval", 4), ("train", 4)]
        eval_ids = {s.id for r in rounds for s in r.sessions}
        assert all(s.info["eval_version"] in (0, 1) for s in store.sessions.list(run) if s.id in eval_ids)
        # never trained: no step manifest names an eval session
        trained = {
            e["session"]
            for step in store.consumers.steps(run, "train:loop")
            for e in step.manifest["samples"]
        }
        assert trained and not trained & eval_ids
        # every step's metrics are in the log, one row per step in the step_metrics view
        with store.db.engine.connect() as conn:
            rows = [
                dict(r._mapping)
                for r in conn.execute(
                    text("SELECT * FROM step_metrics WHERE run_name = :r ORDER BY step"), {"r": run}
                )
            ]
        assert [r["step"] for r in rows] == [1]
        measured = [c for c in STEP_METRIC_COLUMNS if c not in REFERENCE_STEP_METRICS]
        assert all(rows[0][c] is not None for c in measured), rows[0]
        assert all(rows[0][c] is None for c in REFERENCE_STEP_METRICS)  # no train.reference here
        # eval apart: the run's training mean leaves the eval sessions out
        summary = store.runs.summary(run)
        assert sum(summary.eval_sessions.values()) == 4
        train_rewards = [
            x.reward for x in store.sessions.list(run, status="finished") if x.id not in eval_ids
        ]
        assert summary.mean_reward == pytest.approx(sum(train_rewards) / len(train_rewards))
    finally:
        store.close()
