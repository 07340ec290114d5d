"""Megatron-core THD packing with the real ``megatron-core`` package (its CPU-importable parts)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from dressage.errors import TrainingError
from dressage.training.advantages import assign_advantages
from dressage.training.materialize import Trajectory, materialize_trajectory
from dressage.training.samples import TrainSample
from dressage.training.weights import assign_loss_weights
from tests.conftest import require_module
from tests.training.builders import LAYERS, TOP_K, make_turn

torch = require_module("torch", "the 'engine' extra (torch) is not installed")

from dressage.training.megatron_pack import (  # noqa: E402
    pack_megatron,
    sequence_parallel_shard,
    unpack_megatron,
)


def two_turn_sample(rid: int, group: int, n_ctx: int, n_gen: int, reward: float) -> TrainSample:
    """A 2-turn segment: context, generated, context (tool output, mask 0), generated; with experts."""
    ctx1 = list(range(100 + rid, 100 + rid + n_ctx))
    gen1 = list(range(200 + rid, 200 + rid + n_gen))
    ctx2 = [300 + rid, 301 + rid]
    gen2 = list(range(400 + rid, 400 + rid + n_gen))
    t0 = make_turn(0, 0, 0, 0, ctx1, gen1, experts_rows=n_ctx + n_gen - 1)
    t1 = make_turn(1, 0, 0, n_ctx + n_gen, ctx2, gen2, experts_rows=len(ctx2) + n_gen)
    # distinct expert ids per sample, so a misaligned unpack cannot round-trip by accident
    for t in (t0, t1):
        assert t.routed_experts is not None
        t.routed_experts[...] = (t.routed_experts + rid) % 8
    traj = Trajectory(f"s{rid}", reward, "completed", rid, group, rid)
    [sample] = materialize_trajectory([t0, t1], traj)
    return sample


@pytest.fixture(scope="module", autouse=True)
def megatron_params() -> ModuleType:
    """``megatron.core.packed_seq_params``, imported by this module's first test, not at collection:
    importing megatron-core (torch.compile's inductor, wandb) costs ~4 s of CPU, which every process
    that collects the suite (each xdist worker) would otherwise pay whatever tests it runs."""
    return require_module(
        "megatron.core.packed_seq_params", "the 'megatron' extra (megatron-core) is not installed"
    )


@pytest.fixture
def samples() -> list[TrainSample]:
    out = [
        two_turn_sample(0, 0, 5, 3, 1.0),
        two_turn_sample(1, 0, 2, 4, 0.0),
        two_turn_sample(2, 1, 7, 2, 1.0),
    ]
    assign_advantages(out, "grpo")
    assign_loss_weights(out)
    return out


def test_packed_seq_params_and_padding(samples: list[TrainSample], megatron_params: ModuleType) -> None:
    lengths = [int(s.tokens.size) for s in samples]  # 13, 12, 13
    batch = pack_megatron(samples, tp_size=2, pad_multiplier=16)
    params = batch.packed_seq_params
    assert isinstance(params, megatron_params.PackedSeqParams) and params.qkv_format == "thd"
    # 38 tokens padded to a multiple of 2 * 16 = 32 -> 64; the tail is one more pseudo-sequence (slime)
    assert batch.num_tokens == 64 and batch.n_tail_pad == 64 - sum(lengths)
    expected_cu = [0, 13, 25, 38, 64]
    for cu in (
        params.cu_seqlens_q,
        params.cu_seqlens_kv,
        params.cu_seqlens_q_padded,
        params.cu_seqlens_kv_padded,
    ):
        assert cu.dtype == torch.int32 and cu.tolist() == expected_cu
    assert params.max_seqlen_q == params.max_seqlen_kv == 26
    assert batch.tokens_1T.shape == (1, 64) and batch.tokens_1T.dtype == torch.int64
    for name in ("loss_mask_1T", "loss_weights_1T", "advantages_1T", "rollout_log_probs_1T"):
        tensor = getattr(batch, name)
        assert tensor.shape == (1, 64) and tensor.dtype == torch.float32, name
        assert not tensor[0, 38:].any(), f"{name} is nonzero in the padding"
    assert (
        batch.routed_experts_TLK.shape == (64, LAYERS, TOP_K)
        and batch.routed_experts_TLK.dtype == torch.int32
    )
    assert batch.position_ids_1T[0, 13:16].tolist() == [0, 1, 2] and batch.position_ids_1T[
        0, 38:40
    ].tolist() == [0, 1]
    # the whole step's prompt-equal weights survive packing
    assert float(batch.loss_weights_1T.sum()) == pytest.approx(1.0)


def test_alignment_on_predicting_positions(samples: list[TrainSample]) -> None:
    batch = pack_megatron(samples, pad_multiplier=8)
    s = samples[0]  # tokens: 5 ctx, 3 gen, 2 ctx, 3 gen; response starts at the first generated token
    assert s.response_length == 8 and s.loss_mask.tolist() == [1, 1, 1, 0, 0, 1, 1, 1]
    labels = batch.labels_1T[0].tolist()
    assert labels[:12] == s.tokens[1:].tolist() and labels[12] == 0  # last token predicts nothing
    # position 4 predicts token 5 (the first generated one)
    assert batch.loss_mask_1T[0, :13].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0]
    np.testing.assert_allclose(batch.rollout_log_probs_1T[0, 4:7].numpy(), [-0.1, -0.2, -0.3], rtol=1e-6)
    assert batch.advantages_1T[0, 4:12].tolist() == pytest.approx([s.advantage] * 8)
    # routed experts: row p = route of position p; the last token of a sample gets a filler row
    experts = batch.routed_experts_TLK.numpy()
    np.testing.assert_array_equal(experts[:12], s.rollout_routed_experts)
    assert len(set(experts[12, 0].tolist())) == TOP_K and experts.max() < 8


@pytest.mark.parametrize(("tp", "mult", "per_sample"), [(1, 128, 1), (2, 4, 1), (1, 8, 4), (4, 1, 2)])
def test_unpack_round_trips(samples: list[TrainSample], tp: int, mult: int, per_sample: int) -> None:
    batch = pack_megatron(samples, tp_size=tp, pad_multiplier=mult, sample_multiple=per_sample)
    assert batch.num_tokens % (tp * mult) == 0
    params = batch.packed_seq_params
    lengths = np.diff(params.cu_seqlens_q.numpy())[: len(samples)]
    slots = np.diff(params.cu_seqlens_q_padded.numpy())[: len(samples)]
    assert lengths.tolist() == [int(s.tokens.size) for s in samples]
    assert (slots % per_sample == 0).all() and (slots >= lengths).all()
    assert params.max_seqlen_q == int(np.diff(params.cu_seqlens_q_padded.numpy()).max())
    for s, got in zip(samples, unpack_megatron(batch), strict=True):
        np.testing.assert_array_equal(got["tokens"], s.tokens)
        np.testing.assert_array_equal(got["loss_mask"], s.loss_mask)
        np.testing.assert_array_equal(got["loss_weights"], s.loss_weights)
        np.testing.assert_array_equal(got["rollout_log_probs"], s.rollout_log_probs)
        np.testing.assert_allclose(got["advantages"], np.full(s.response_length, s.advantage), rtol=1e-6)
        np.testing.assert_array_equal(got["rollout_routed_experts"], s.rollout_routed_experts)


def test_sequence_parallel_shards_cover_the_stream(samples: list[TrainSample]) -> None:
    batch = pack_megatron(samples, tp_size=4, pad_multiplier=4)
    shards = [sequence_parallel_shard(batch.routed_experts_TLK, r, 4) for r in range(4)]
    assert all(x.shape[0] == batch.num_tokens // 4 for x in shards)
    assert torch.equal(torch.cat(shards), batch.routed_experts_TLK)


def test_without_experts_and_errors(samples: list[TrainSample]) -> None:
    samples[1].rollout_routed_experts = None
    batch = pack_megatron(samples)
    assert batch.routed_experts_TLK is None and batch.num_tokens == 128
    with pytest.raises(TrainingError, match=">= 1"):
        pack_megatron(samples, pad_multiplier=0)
    broken = samples[0]
    assert broken.rollout_routed_experts is not None
    broken.rollout_routed_experts = broken.rollout_routed_experts[:-1]
    with pytest.raises(TrainingError, match="routed-expert rows"):
        pack_megatron([broken])


def test_missing_megatron_names_the_package(
    samples: list[TrainSample], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from dressage.errors import NotSupportedError

    monkeypatch.setitem(sys.modules, "megatron.core.packed_seq_params", None)  # import now fails
    with pytest.raises(NotSupportedError, match="pip install megatron-core"):
        pack_megatron(samples)
