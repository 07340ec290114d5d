"""Per-token decisions: each trained token's advantage, importance weight and mask reason, in the
log with its step, readable through the ``token_decisions`` view, checked by replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sqlalchemy import select, text, update
from typer.testing import CliRunner

from dressage.errors import ReplayDriftError
from dressage.store import EventStore, schema
from dressage.training import StepOptions, Trainer
from dressage.training.masking import MASK_REASONS
from dressage.training.torch_backend import TorchBackend, build_model
from tests.cli.helpers import sql_json
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, build_run

TIS_CAP = 2.0
OPTIONS = StepOptions(2, 2, initial_version=3)  # step 1 trains version 3; max_staleness 1: v < 2 is stale


def _group() -> list[TrajSpec]:
    """Two trajectories of one group: rewards 1 and 0, so GRPO gives +0.5 and -0.5."""
    mixed = TrajSpec(
        1.0,
        [
            SegmentSpec(
                0,
                [
                    TurnSpec(4, 3, versions=[3, 3, 3], mask=[True, False, True]),
                    TurnSpec(2, 3, versions=[1, 2, 3]),
                ],
            )
        ],
    )
    plain = TrajSpec(0.0, [SegmentSpec(0, [TurnSpec(4, 3, 3), TurnSpec(4, 3, 3)])])
    return [mixed, plain]


# What a reader works out by hand from the specs above (positions of the segment, 0-based):
# mixed: 0-3 prompt; 4 trained, 5 recorded loss mask 0, 6 trained; 7-8 tool context; 9 sampled by
# version 1 (3 - 1 > 1: stale), 10-11 trained.  plain: 0-3 prompt, 4-6 trained, 7-10 context, 11-13 trained.
EXPECTED = {
    "t0-s0": (
        0.5,
        ["prompt"] * 4
        + ["trained", "recorded_untrained", "trained", "not_generated", "not_generated", "stale"]
        + ["trained"] * 2,
    ),
    "t0-s1": (-0.5, ["prompt"] * 4 + ["trained"] * 3 + ["not_generated"] * 4 + ["trained"] * 3),
}


def _rows(db_url: str, run: str) -> list[dict]:
    return sql_json(
        CliRunner(env={"COLUMNS": "200"}),
        db_url,
        "SELECT d.session_id, d.position, d.token_id, d.advantage, d.importance_weight, d.mask_code, "
        "d.mask_reason, d.step, d.consumer, e.token_id AS event_token FROM token_decisions d "
        "JOIN token_events e ON e.session_id = d.session_id AND e.segment_index = d.segment_index "
        f"AND e.position = d.position WHERE d.run_name = '{run}' ORDER BY d.session_id, d.position",
    )


def test_the_view_agrees_with_a_hand_computed_advantage_and_mask(
    store: EventStore, db_url: str, run_name: str, tmp_path: Path
) -> None:
    build_run(store, run_name, [_group()])
    backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3", lr=0.5, seed=3, tis_cap=TIS_CAP)
    [result] = Trainer(store, run_name, OPTIONS, backend).run_steps()
    rows = _rows(db_url, run_name)
    by_session: dict[str, list[dict]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"].removeprefix(f"{run_name}-").removesuffix("-a1"), []).append(
            row
        )
    assert sorted(by_session) == sorted(EXPECTED)
    for key, (advantage, reasons) in EXPECTED.items():
        got = by_session[key]
        assert [r["position"] for r in got] == list(range(len(reasons)))  # every token of the segment
        assert [r["mask_reason"] for r in got] == reasons, key
        assert {r["advantage"] for r in got} == {advantage}
        assert all(r["token_id"] == r["event_token"] for r in got)
        assert {(r["step"], r["consumer"]) for r in got} == {(1, "train:main")}
        for r in got:  # a weight on every trained token, 0 on masked response tokens, none on the prompt
            if r["mask_reason"] == "prompt":
                assert r["importance_weight"] is None
            elif r["mask_reason"] == "trained":
                assert 0 < r["importance_weight"] <= TIS_CAP
            else:
                assert r["importance_weight"] == 0
    # the trained tokens of the view are exactly the batch's loss mask
    sample = result.batch.samples[0]
    trained_view = [r["mask_reason"] == "trained" for r in by_session["t0-s0"][sample.response_start :]]
    assert trained_view == sample.loss_mask.astype(bool).tolist()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_importance_weights_are_the_ones_the_loss_used(
    store: EventStore, run_name: str, tmp_path: Path
) -> None:
    """Recomputed from the initial model (same seed) on the batch replay gives back."""
    build_run(store, run_name, [_group()])
    backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3", lr=0.5, seed=3, tis_cap=TIS_CAP)
    Trainer(store, run_name, OPTIONS, backend).run_steps()
    [recorded] = store.consumers.decisions(run_name, "train:main").values()
    [batch] = Trainer(store, run_name, OPTIONS).replay()
    model = build_model("tiny-qwen3", seed=3)
    with torch.no_grad():
        for s, d in zip(batch.samples, recorded, strict=True):
            tokens = torch.as_tensor(s.tokens, dtype=torch.long)
            logp = torch.log_softmax(model(input_ids=tokens[None]).logits[0].float()[:-1], dim=-1)
            logp_R = logp.gather(-1, tokens[1:, None])[:, 0][-s.response_length :].numpy()
            tis_R = np.minimum(np.exp(logp_R - s.rollout_log_probs), TIS_CAP) * s.loss_mask
            assert d.importance_weights is not None
            np.testing.assert_allclose(d.importance_weights, tis_R, rtol=1e-5)
            assert (d.importance_weights > 0).sum() == s.loss_mask.sum() > 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_replay_compares_advantages_and_mask_reasons(store: EventStore, run_name: str) -> None:
    build_run(store, run_name, [_group()])
    Trainer(store, run_name, OPTIONS).run_steps()
    [recorded] = store.consumers.decisions(run_name, "train:main").values()
    assert [d.importance_weights for d in recorded] == [None, None]  # backend none computes none
    assert len(Trainer(store, run_name, OPTIONS).replay()) == 1
    d = schema.train_token_decisions.c
    mine = d.run_id == store.runs.get(run_name).id
    with store.db.write() as conn:
        conn.execute(update(schema.train_token_decisions).where(mine, d.sample == 1).values(advantage=-0.25))
    with pytest.raises(ReplayDriftError, match=r"step 1 .* advantage was recorded as -0\.25, .* gives -0\.5"):
        Trainer(store, run_name, OPTIONS).replay()
    with store.db.write() as conn:
        reasons = conn.execute(select(d.mask_reasons).where(mine, d.sample == 0)).scalar_one()
        reasons[1] = 0
        conn.execute(
            update(schema.train_token_decisions).where(mine, d.sample == 0).values(mask_reasons=reasons)
        )
        conn.execute(update(schema.train_token_decisions).where(mine, d.sample == 1).values(advantage=-0.5))
    with pytest.raises(ReplayDriftError, match=r"mask reason of response token 1 was recorded as 0"):
        Trainer(store, run_name, OPTIONS).replay()


def test_the_reason_table_is_the_vocabulary(store: EventStore) -> None:
    with store.db.read() as conn:
        rows = conn.execute(text("SELECT code, reason, meaning FROM mask_reasons ORDER BY code")).all()
    assert [(r.code, r.reason, r.meaning) for r in rows] == [
        (i, name, meaning) for i, (name, meaning) in enumerate(MASK_REASONS)
    ]
    assert "tree_shared" in {r.reason for r in rows}
