"""Step metrics in the log: recorded with each step, readable by SQL, recomputable, replayed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from sqlalchemy import update
from typer.testing import CliRunner

from dressage.errors import ReplayDriftError
from dressage.store import EventStore, schema
from dressage.store.views import STEP_METRIC_COLUMNS
from dressage.training import StepOptions, Trainer
from dressage.training.metrics import BATCH_METRICS, TORCH_METRICS
from dressage.training.torch_backend import TorchBackend, build_model
from tests.cli.helpers import sql_json
from tests.training.builders import build_run, recompute_loss_and_grad_norm, simple


def _train(store: EventStore, run: str, tmp_path: Path) -> list:
    build_run(store, run, [[simple(1.0), simple(0.0)], [simple(0.25, n_turns=1), simple(0.75)]])
    backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3", lr=0.5, seed=3)
    return Trainer(store, run, StepOptions(2, 2), backend).run_steps()


def test_every_metric_is_in_the_log_and_the_sql_view(
    store: EventStore, db_url: str, run_name: str, tmp_path: Path
) -> None:
    results = _train(store, run_name, tmp_path)
    assert len(results) == 2
    stored = store.consumers.metrics(run_name, "train:main")
    rows = sql_json(
        CliRunner(env={"COLUMNS": "200"}),
        db_url,
        f"SELECT * FROM step_metrics WHERE run_name = '{run_name}' ORDER BY step",
    )
    assert [r["step"] for r in rows] == [1, 2]
    for result, row in zip(results, rows, strict=True):
        mine = stored[result.batch.step]
        assert mine == result.metrics  # exactly what the trainer computed
        for name in (*BATCH_METRICS, *TORCH_METRICS, "step_time_s", "tokens_per_s"):
            assert name in STEP_METRIC_COLUMNS
            assert row[name] is not None and math.isfinite(row[name]), name
            assert row[name] == pytest.approx(mine[name], rel=1e-12, abs=1e-300), name
        # every trained token was sampled by policy 0; step k trains version k - 1
        stale = result.batch.step - 1
        assert mine[f"staleness_tokens_{stale}"] == mine["trained_tokens"] > 0
        assert mine["staleness_mean"] == mine["staleness_max"] == stale
        assert mine["pg_loss"] == mine["loss"] and mine["lr"] == 0.5
    assert stored[1]["reward_mean"] == 0.5 and stored[1]["reward_std"] == 0.5
    assert stored[2]["reward_mean"] == 0.5 and stored[2]["reward_std"] == 0.25


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_loss_and_grad_norm_recomputed_from_the_stored_samples(
    store: EventStore, run_name: str, tmp_path: Path
) -> None:
    """Step 1's loss and grad norm again: the initial model (same seed) on the batch the log gives
    back (replay re-forms it from the stored turns), with the backend's loss function."""
    _train(store, run_name, tmp_path)
    recorded = store.consumers.metrics(run_name, "train:main")[1]
    [batch, _] = Trainer(store, run_name, StepOptions(2, 2)).replay()
    model = build_model("tiny-qwen3", seed=3)
    total, grad_norm = recompute_loss_and_grad_norm(model, batch.samples)
    assert total == pytest.approx(recorded["loss"], rel=1e-6)
    assert grad_norm == pytest.approx(recorded["grad_norm"], rel=1e-6)
    assert recorded["grad_norm"] > 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_replay_compares_the_batch_metrics_bitwise(store: EventStore, run_name: str, tmp_path: Path) -> None:
    _train(store, run_name, tmp_path)
    assert len(Trainer(store, run_name, StepOptions(2, 2)).replay()) == 2
    m = schema.train_step_metrics.c
    with store.db.write() as conn:
        conn.execute(
            update(schema.train_step_metrics)
            .where(m.step == 2, m.name == "reward_mean", m.consumer == "train:main")
            .values(value=0.5000000000000001)
        )
    with pytest.raises(
        ReplayDriftError, match=r"step 2 .* metric reward_mean was recorded as 0\.5000000000000001"
    ):
        Trainer(store, run_name, StepOptions(2, 2)).replay()


def _k3_mean(model: torch.nn.Module, reference: torch.nn.Module, samples: list) -> float:
    """Mean k3 estimate of KL(model || reference) over the trained tokens of ``samples``."""
    total, n = 0.0, 0
    with torch.no_grad():
        for s in samples:
            tokens = torch.as_tensor(s.tokens, dtype=torch.long)
            logps = []
            for m in (model, reference):
                logp = torch.log_softmax(m(input_ids=tokens[None]).logits[0].float()[:-1], dim=-1)
                logps.append(logp.gather(-1, tokens[1:, None])[:, 0][-s.response_length :])
            log_r = logps[1].double() - logps[0].double()
            k3 = (torch.expm1(log_r) - log_r)[torch.as_tensor(s.loss_weights) > 0]
            total += float(k3.double().sum())
            n += k3.numel()
    return total / n


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_kl_to_the_initial_weights_is_recorded_and_recomputable(
    store: EventStore, run_name: str, tmp_path: Path, kl_coef: float
) -> None:
    """Step 1 trains the initial weights: KL 0. Step 2's KL, recomputed from the samples the log
    gives back with step 1's saved weights against a fresh initial model, is the recorded one."""
    from safetensors.torch import load_model

    build_run(store, run_name, [[simple(1.0), simple(0.0)], [simple(0.25, n_turns=1), simple(0.75)]])
    ckpt = tmp_path / "ckpt"
    backend = TorchBackend(ckpt, model="tiny-qwen3", lr=0.5, seed=3, reference="initial", kl_coef=kl_coef)
    Trainer(store, run_name, StepOptions(2, 2), backend).run_steps()
    recorded = store.consumers.metrics(run_name, "train:main")
    assert recorded[1]["kl_reference"] == 0.0
    [view] = sql_json(
        CliRunner(env={"COLUMNS": "200"}),
        str(store.db.engine.url),
        f"SELECT kl_reference, kl_loss FROM step_metrics WHERE run_name = '{run_name}' AND step = 2",
    )
    assert view["kl_reference"] == recorded[2]["kl_reference"] > 0
    assert view["kl_loss"] == recorded[2].get("kl_loss")
    assert recorded[2]["kl_reference"] > 0
    batches = Trainer(store, run_name, StepOptions(2, 2)).replay()
    after_step_1 = build_model("tiny-qwen3", seed=3)
    load_model(after_step_1, str(ckpt / "step-000001.safetensors"))
    expected = _k3_mean(after_step_1, build_model("tiny-qwen3", seed=3), batches[1].samples)
    assert expected == pytest.approx(recorded[2]["kl_reference"], rel=1e-4)
    if kl_coef:  # the term is in the loss: 0 at step 1, and the loss is its sum with the PG part
        assert recorded[1]["kl_loss"] == 0.0 and recorded[1]["loss"] == recorded[1]["pg_loss"]
        assert recorded[2]["kl_loss"] > 0
        assert recorded[2]["loss"] == pytest.approx(recorded[2]["pg_loss"] + recorded[2]["kl_loss"], rel=1e-6)
    else:
        assert "kl_loss" not in recorded[2] and recorded[2]["loss"] == recorded[2]["pg_loss"]


def test_a_kl_coefficient_needs_a_reference(tmp_path: Path) -> None:
    from dressage.errors import ConfigError
    from dressage.training.config import TrainConfig

    with pytest.raises(ValueError, match="kl_coef > 0 needs a reference model"):
        TrainConfig(kl_coef=0.1)
    with pytest.raises(ConfigError, match="kl_coef > 0 needs a reference model"):
        TorchBackend(tmp_path, kl_coef=0.1)
    with pytest.raises(ConfigError, match="reference must be 'initial'"):
        TorchBackend(tmp_path, reference="sft")
