"""``--log-to wandb,tensorboard``: the log's step metrics and rewards, read back with each tool's reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dressage.store import EventStore
from dressage.training.loggers import version_rewards
from tests.cli.helpers import add_eval_session, invoke
from tests.training.builders import build_run, simple
from tests.training.wandb_log import history


def _train(cli: CliRunner, db_url: str, run: str, out: Path, log_to: str) -> None:
    result = invoke(
        cli, db_url, "train", "--from-run", run, "--backend", "torch", "--model", "tiny-qwen3",
        "--global-batch-size", "2", "--n-samples-per-prompt", "2", "--out", str(out), "--log-to", log_to,
    )  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_tensorboard_and_wandb_hold_the_logs_values(
    store: EventStore, db_url: str, run_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'dressage[tensorboard]'")
    pytest.importorskip("wandb", reason="the wandb extra: pip install 'dressage[wandb]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # no key: offline
    monkeypatch.setenv("WANDB_SILENT", "true")
    build_run(store, run_name, [[simple(1.0), simple(0.0)], [simple(0.25, n_turns=1), simple(0.75)]])
    store.versions.record(run_name, 0)
    add_eval_session(store, run_name, version=0, reward=0.125, task_index=7)
    out = tmp_path / "out"
    _train(CliRunner(), db_url, run_name, out, "wandb,tensorboard")
    logged = store.consumers.metrics(run_name, "train:main")
    assert sorted(logged) == [1, 2]
    rewards = version_rewards(store, run_name)
    assert rewards == {0: {"train": 0.5, "eval": 0.125}}

    tb = EventAccumulator(str(out / "tensorboard"))
    tb.Reload()
    for name in {*logged[1], *logged[2]}:
        steps = [s for s in (1, 2) if name in logged[s]]
        events = tb.Scalars(f"train/{name}")
        assert [e.step for e in events] == steps, name
        # TensorBoard keeps scalars as float32: the log's values, rounded
        assert [e.value for e in events] == [float(np.float32(logged[s][name])) for s in steps], name
    assert [(e.step, e.value) for e in tb.Scalars("reward/train")] == [(0, 0.5)]
    assert [(e.step, e.value) for e in tb.Scalars("reward/eval")] == [(0, 0.125)]

    [run_dir] = (out / "wandb").glob("offline-run-*")
    rows = history(run_dir)
    by_step = {r["train/step"]: r for r in rows if "train/loss" in r}
    assert sorted(by_step) == [1, 2], rows
    for step in (1, 2):
        row = by_step[step]
        assert {k[6:]: v for k, v in row.items() if k.startswith("train/") and k != "train/step"} == logged[
            step
        ]
    [version_row] = [r for r in rows if "policy_version" in r]
    assert (version_row["policy_version"], version_row["reward/train"], version_row["reward/eval"]) == (
        0,
        0.5,
        0.125,
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_the_extras_log_to_is_one_line_and_nothing_else_changes(
    store: EventStore, db_url: str, run_name: str, tmp_path: Path
) -> None:
    """With wandb and tensorboard unimportable, ``--log-to`` says what to install, commits nothing;
    without ``--log-to`` training runs as before. An unknown logger is refused by name."""
    build_run(store, run_name, [[simple(1.0), simple(0.0)]])
    hide = "import sys; sys.modules['wandb'] = None; sys.modules['tensorboard'] = None; "
    args = [
        "--from-run",
        run_name,
        "--backend",
        "none",
        "--global-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
    ]
    base = [*args, "--database-url", db_url, "--out", str(tmp_path / "o")]

    def train(*extra: str) -> subprocess.CompletedProcess[str]:
        code = (
            hide
            + "from dressage.cli import main; sys.argv = ['dressage-worker', 'train', *sys.argv[1:]]; main()"
        )
        return subprocess.run(
            [sys.executable, "-c", code, *base, *extra],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    for logger, extra in (("wandb", "dressage[wandb]"), ("tensorboard", "dressage[tensorboard]")):
        failed = train("--log-to", logger)
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr.strip().splitlines() == [
            next(x for x in failed.stderr.strip().splitlines() if x.startswith("error:"))
        ]
        assert f"pip install '{extra}'" in failed.stderr
    assert store.consumers.steps(run_name, "train:main") == []
    unknown = train("--log-to", "mlflow")
    assert unknown.returncode != 0 and "unknown logger 'mlflow'" in unknown.stderr
    plain = train()
    assert plain.returncode == 0, plain.stderr
    assert len(store.consumers.steps(run_name, "train:main")) == 1


def test_loop_log_to_comes_from_the_config_key_or_the_option(tmp_path: Path) -> None:
    """``train.log_to`` in run.yaml, overridden by ``--log-to``; a bad name is refused by name."""
    from dressage.errors import ConfigError
    from dressage.loop.runner import LoopOptions, resolve
    from dressage.rollout.config import load_config
    from dressage.training.loggers import parse_log_to
    from tests.loop.test_loop import write_config

    path = write_config(tmp_path, "sync", {"log_to": ["wandb"]})
    assert resolve(load_config(str(path)), LoopOptions(str(path)))[2].log_to == ["wandb"]
    overridden = LoopOptions(str(path), log_to=parse_log_to("tensorboard"))
    assert resolve(load_config(str(path)), overridden)[2].log_to == ["tensorboard"]
    bad = write_config(tmp_path, "sync", {"log_to": ["mlflow"]})
    with pytest.raises(ConfigError, match="log_to"):
        load_config(str(bad))
