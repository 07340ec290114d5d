"""Training on several runs: hand-checked importance weights from each run's recorded behaviour
logprobs, the staleness rule across runs, the manifest's run of origin, and a bitwise replay."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dressage.cli import app
from dressage.errors import ConfigError
from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.training import StepOptions
from dressage.training.masking import MaskingPolicy
from dressage.training.multirun import ROLLOUT_ID_STRIDE, MultiRunTrainer
from dressage.training.torch_backend import ppo_clip_tis_loss

LOGPROBS = {"a": [[-0.5, -1.0], [-0.25, -0.75]], "b": [[-2.0, -3.0], [-1.5, -0.1]]}
REWARDS = [1.0, 0.0]


def _run(store: EventStore, name: str, logprobs: list[list[float]]) -> None:
    """One group of two one-turn sessions: context [1, 2, 3], two generated tokens at version 0."""
    store.runs.create(name)
    store.tasks.enqueue(name, [TaskSpec(0, {"prompt": name})], n_samples=2)
    while leases := store.tasks.claim(name, "w", n=1):
        lease = leases[0]
        sid = f"{name}-s{lease.sample_index}"
        store.sessions.open(name, session_id=sid, task_id=lease.task_id, attempt=lease.attempt)
        lps = logprobs[lease.sample_index]
        store.turns.append(name, NewTurn(sid, 0, [1, 2, 3], [7, 8], lps, [0, 0], finish_reason="stop"))
        store.sessions.finalize(sid, "finished", reward=REWARDS[lease.sample_index])
        store.tasks.release(lease, "done")


@pytest.fixture
def runs(store: EventStore, run_name: str) -> tuple[str, str]:
    a, b = f"{run_name}-a", f"{run_name}-b"
    _run(store, a, LOGPROBS["a"])
    _run(store, b, LOGPROBS["b"])
    return a, b


def test_two_runs_weights_origin_and_replay(store: EventStore, runs: tuple[str, str]) -> None:
    a, b = runs
    trainer = MultiRunTrainer(store, [a, b], StepOptions(4, 2))
    [batch] = trainer.run_steps()
    origin = {e["session"]: e["run"] for e in batch.manifest["samples"]}
    assert origin == {f"{a}-s0": a, f"{a}-s1": a, f"{b}-s0": b, f"{b}-s1": b}
    assert batch.manifest["runs"] == [a, b] and [g["run"] for g in batch.manifest["groups"]] == [a, b]
    assert {s.rollout_id for s in batch.samples} == {0, 1, ROLLOUT_ID_STRIDE, ROLLOUT_ID_STRIDE + 1}

    # truncated importance weights min(exp(old - behaviour), 2) against a current policy at -1.0,
    # by hand: run a: exp(-0.5), exp(0), exp(-0.75), exp(-0.25); run b: exp(1) and exp(2) capped
    # at 2, exp(0.5) = 1.6487 (under the cap), exp(-0.9)
    expected = {
        f"{a}-s0": [math.exp(-0.5), 1.0],
        f"{a}-s1": [math.exp(-0.75), math.exp(-0.25)],
        f"{b}-s0": [2.0, 2.0],
        f"{b}-s1": [math.exp(0.5), math.exp(-0.9)],
    }
    for s in batch.samples:
        run_key = "a" if s.session_id.startswith(a + "-") else "b"
        np.testing.assert_array_equal(
            s.rollout_log_probs, np.float32(LOGPROBS[run_key][int(s.session_id[-1])])
        )
        for t, weight in enumerate(expected[s.session_id]):
            _, stats = ppo_clip_tis_loss(
                torch.tensor([-1.0]),
                torch.tensor([float(s.rollout_log_probs[t])]),
                torch.tensor([1.0]),
                torch.tensor([1.0]),
            )
            assert stats["tis_mean"] == pytest.approx(weight, rel=1e-6)

    replayed = MultiRunTrainer(store, [a, b], StepOptions(4, 2)).replay()
    assert [x.batch_hash for x in replayed] == [batch.batch_hash]
    with pytest.raises(ConfigError, match="same --from-run list"):
        MultiRunTrainer(store, [a], StepOptions(4, 2)).run_steps()


def test_staleness_across_runs(store: EventStore, runs: tuple[str, str]) -> None:
    """Run b's version 0 placed one version behind run a's: max_staleness 0 masks b's tokens."""
    a, b = runs
    options = StepOptions(4, 2, masking=MaskingPolicy(max_staleness=0))
    [batch] = MultiRunTrainer(store, [a, b], options, consumer="stale", version_offsets=[0, -1]).run_steps()
    for s in batch.samples:
        assert s.loss_mask.tolist() == ([1, 1] if s.session_id.startswith(a + "-") else [0, 0])


def test_train_cli_on_two_runs_replays(
    db_url: str, store: EventStore, runs: tuple[str, str], tmp_path
) -> None:
    a, b = runs
    cli = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    args = ["train", "--from-run", a, "--from-run", b, "--database-url", db_url, "--backend", "none"]
    args += ["--global-batch-size", "4", "--n-samples-per-prompt", "2", "--out", str(tmp_path / "o")]
    first = cli.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "4 samples from" in first.stderr and "1 steps recorded" in first.stderr
    replay = cli.invoke(app, [*args, "--replay"])
    assert replay.exit_code == 0, replay.output
    assert "every batch hash matches" in replay.stderr
    swapped = cli.invoke(
        app, ["train", "--from-run", b, "--from-run", a, "--database-url", db_url, "--replay"]
    )
    assert swapped.exit_code in (0, 1)
