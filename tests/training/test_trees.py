"""Training on a trajectory tree: hand-computed node values and advantages, shared tokens once.

The tree is built directly in the store (both backends) the way a fork records it: a child
session opened with ``parent_session_id`` / ``fork_turn = K`` whose turns ``0 .. K-1`` are copies
of the parent's (``info.replayed_from``) and whose later turns are its own.

One task, two roots (``n_samples_per_prompt`` 2), 3 generated tokens per turn::

    R (reward 1.0, 4 turns) ── A (fork at 2 from R, reward 0.0, 4 turns) ── C (fork at 3 from A, reward 1.0)
                            └─ B (fork at 2 from R, reward 0.5, 4 turns)
    S (reward 0.0, 2 turns, no forks)

Leaves R, A, B, C, S: the group's root value is (1 + 0 + 0.5 + 1 + 0) / 5 = 0.5.

=====================  ==================  ======  ============================
node (owner, turns)    leaves              V       A = V - V(parent)
=====================  ==================  ======  ============================
R [0, 2)               R, A, B, C          0.625   0.625 - 0.5   =  0.125
S [0, 2)               S                   0.0     0.0 - 0.5     = -0.5
R [2, 4)               R                   1.0     1.0 - 0.625   =  0.375
A [2, 3)               A, C                0.5     0.5 - 0.625   = -0.125
B [2, 4)               B                   0.5     0.5 - 0.625   = -0.125
A [3, 4)               A                   0.0     0.0 - 0.5     = -0.5
C [3, 4)               C                   1.0     1.0 - 0.5     =  0.5
=====================  ==================  ======  ============================

Trained generated tokens: R 4 turns + A 2 + B 2 + C 1 + S 2 = 11 turns x 3 = 33 (each session
trained whole would be 4 + 4 + 4 + 4 + 2 = 18 turns, 54 tokens).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.store.records import Turn
from dressage.training.groups import GroupTracker
from dressage.training.steps import StepBuilder, StepOptions
from dressage.training.trees import TREE_ID_STRIDE, TREE_SHARED, node_samples
from tests.training.test_slime_rollout import call_like_slime, slime_args, slime_on_path

__all__ = ["slime_on_path"]  # a fixture these tests use

N_CTX, N_GEN = 2, 3
TREE_CONFIG = {"rollout": {"branching": {"width": 2}}}

EXPECTED_NODES = {  # (owner, first turn, end turn) -> (value, advantage)
    ("R", 0, 2): (0.625, 0.125),
    ("S", 0, 2): (0.0, -0.5),
    ("R", 2, 4): (1.0, 0.375),
    ("A", 2, 3): (0.5, -0.125),
    ("B", 2, 4): (0.5, -0.125),
    ("A", 3, 4): (0.0, -0.5),
    ("C", 3, 4): (1.0, 0.5),
}
EXPECTED_TURN_ADVANTAGES = {  # session -> advantage of each of its turns' tokens
    "R": [0.125, 0.125, 0.375, 0.375],
    "A": [0.125, 0.125, -0.125, -0.5],
    "B": [0.125, 0.125, -0.125, -0.125],
    "C": [0.125, 0.125, -0.125, 0.5],
    "S": [-0.5, -0.5],
}
TRAINED_TURNS = {"R": [0, 1, 2, 3], "A": [2, 3], "B": [2, 3], "C": [3], "S": [0, 1]}


def _live_turn(sid: str, index: int, rng: np.random.Generator) -> NewTurn:
    return NewTurn(
        session_id=sid,
        turn_index=index,
        context_ids=rng.integers(0, 4096, N_CTX).tolist(),
        generated_ids=rng.integers(0, 4096, N_GEN).tolist(),
        logprobs=(-rng.random(N_GEN) - 0.1).astype(np.float32).tolist(),
        policy_versions=[0] * N_GEN,
        route="append" if index else "create",
        segment_offset=index * (N_CTX + N_GEN),
        finish_reason="stop",
    )


def _replayed(sid: str, turn: Turn) -> NewTurn:
    """The parent's turn as the fork records it: the same ids, logprobs, masks and versions."""
    return NewTurn.from_turn(turn, sid, info={"replayed_from": turn.id})


def _session(
    store: EventStore, run: str, sid: str, task_id: int, n_turns: int, reward: float,
    parent: str | None = None, fork_turn: int | None = None, rng: np.random.Generator | None = None,
) -> None:  # fmt: skip
    rng = rng or np.random.default_rng(0)
    fork = {"parent_session_id": f"{run}-{parent}", "fork_turn": fork_turn} if parent else {}
    full = f"{run}-{sid}"
    store.sessions.open(run, session_id=full, task_id=task_id, **fork)  # type: ignore[arg-type]
    if parent is not None:
        assert fork_turn is not None
        for turn in sorted(store.turns.read(session_ids=[f"{run}-{parent}"]), key=lambda x: x.turn_index):
            if turn.turn_index < fork_turn:
                store.turns.append(run, _replayed(full, turn))
    for i in range(fork_turn or 0, n_turns):
        store.turns.append(run, _live_turn(full, i, rng))
    store.sessions.finalize(full, "finished", reward=reward)


def build_tree_run(store: EventStore, run: str) -> None:
    """The tree of the module docstring, released ``done`` once each root's whole tree is played."""
    rng = np.random.default_rng(7)
    store.runs.create(run, TREE_CONFIG)
    store.tasks.enqueue(run, [TaskSpec(0, {"prompt": "p"})], n_samples=2)
    leases = sorted(store.tasks.claim(run, "w", n=2), key=lambda x: x.sample_index)
    first, second = leases
    _session(store, run, "R", first.task_id, 4, 1.0, rng=rng)
    _session(store, run, "A", first.task_id, 4, 0.0, "R", 2, rng)
    _session(store, run, "C", first.task_id, 4, 1.0, "A", 3, rng)
    _session(store, run, "B", first.task_id, 4, 0.5, "R", 2, rng)
    _session(store, run, "S", second.task_id, 2, 0.0, rng=rng)
    store.tasks.release(second, "done")
    store.tasks.release(first, "done")


def _step(store: EventStore, run: str, estimator: str = "tree"):  # type: ignore[no-untyped-def]
    tracker = GroupTracker(store, run, n_samples_per_prompt=2)
    groups = tracker.poll()
    options = StepOptions(global_batch_size=2, n_samples_per_prompt=2, advantage_estimator=estimator)
    builder = StepBuilder(store, store.runs.get(run), options)
    return builder.form(1, groups, (0, -1))


def test_tree_advantages_and_shared_tokens_once(store: EventStore, run_name: str) -> None:
    build_tree_run(store, run_name)
    batch = _step(store, run_name)
    assert batch is not None
    decision = batch.manifest["groups"][0]
    assert decision["kept"] is True
    nodes = {
        (n["owner"].removeprefix(f"{run_name}-"), *n["turns"]): (n["value"], n["advantage"])
        for n in decision["tree"]["nodes"]
    }
    assert nodes == EXPECTED_NODES  # dyadic values: exact in float64
    assert decision["tree"]["root_value"] == pytest.approx(0.5)
    by_session = {s.session_id.removeprefix(f"{run_name}-"): s for s in batch.samples}
    assert sorted(by_session) == ["A", "B", "C", "R", "S"]
    for name, sample in by_session.items():
        turn_R = np.arange(sample.tokens.size)[sample.response_start :] // (N_CTX + N_GEN)
        gen_R = np.arange(sample.tokens.size)[sample.response_start :] % (N_CTX + N_GEN) >= N_CTX
        expected_adv = np.asarray(EXPECTED_TURN_ADVANTAGES[name])[turn_R]
        assert sample.advantages is not None
        np.testing.assert_allclose(sample.advantages, expected_adv, rtol=0, atol=1e-7)
        trained = gen_R & np.isin(turn_R, TRAINED_TURNS[name])
        np.testing.assert_array_equal(sample.loss_mask.astype(bool), trained, err_msg=name)
        shared = int((gen_R & ~np.isin(turn_R, TRAINED_TURNS[name])).sum())
        assert sample.masking[f"masked_{TREE_SHARED}"] == shared
        assert sample.advantage == pytest.approx(EXPECTED_TURN_ADVANTAGES[name][-1])  # the leaf's node
    assert sum(s.n_trainable for s in batch.samples) == 33 == batch.manifest["n_trainable_tokens"]
    weights = np.concatenate([s.loss_weights[s.loss_mask.astype(bool)] for s in batch.samples])
    np.testing.assert_allclose(weights, 1 / 33, rtol=1e-6)  # one prompt: every trained token once
    assert batch.manifest["n_trajectories"] == 5
    rids = {name: s.rollout_id for name, s in by_session.items()}
    assert rids == {
        "R": 0,
        "A": 1,
        "B": 2,
        "C": 3,
        "S": TREE_ID_STRIDE,
    }


def test_a_tree_needs_the_tree_estimator(store: EventStore, run_name: str) -> None:
    from dressage.errors import ConfigError

    build_tree_run(store, run_name)
    with pytest.raises(ConfigError, match="advantage estimator 'tree', not 'grpo'"):
        _step(store, run_name, "grpo")


def test_tree_samples_for_slime_carry_one_advantage_per_node(store: EventStore, run_name: str) -> None:
    """slime's Sample has one reward: a tree sample splits into one sample per node it trains."""
    build_tree_run(store, run_name)
    batch = _step(store, run_name)
    assert batch is not None
    parts = [p for s in batch.samples for p in node_samples(s)]
    by_session: dict[str, list[tuple[float, int, int]]] = {}
    for p in parts:
        name = p.session_id.removeprefix(f"{run_name}-")
        by_session.setdefault(name, []).append((p.advantage, p.n_trainable, int(p.tokens.size)))
        assert p.advantages is None
        assert p.response_start >= 1 and p.loss_mask.size == p.response_length
    turn = N_CTX + N_GEN
    assert by_session == {
        "R": [(0.125, 6, 2 * turn), (0.375, 6, 4 * turn)],
        "A": [(-0.125, 3, 3 * turn), (-0.5, 3, 4 * turn)],
        "B": [(-0.125, 6, 4 * turn)],
        "C": [(0.5, 3, 4 * turn)],
        "S": [(-0.5, 6, 2 * turn)],
    }
    assert sum(p.n_trainable for p in parts) == 33
    for s in batch.samples:  # each part's tokens are a prefix of its sample's; trained logprobs kept
        for p in node_samples(s):
            np.testing.assert_array_equal(p.tokens, s.tokens[: p.tokens.size])


def test_torch_backend_trains_each_node_once_with_its_advantage(
    store: EventStore, run_name: str, tmp_path: Path
) -> None:
    """The step's loss equals ``sum w * tis * (-A_node)`` over each node's tokens counted once."""
    import torch

    from dressage.training.torch_backend import TorchBackend, build_model

    build_tree_run(store, run_name)
    batch = _step(store, run_name)
    assert batch is not None
    model = build_model("tiny-qwen3", seed=0)
    expected = 0.0
    with torch.no_grad():
        for s in batch.samples:
            name = s.session_id.removeprefix(f"{run_name}-")
            tokens = torch.as_tensor(s.tokens, dtype=torch.long)
            logp = torch.log_softmax(model(input_ids=tokens[None]).logits[0].float()[:-1], -1)
            logp_T = logp.gather(-1, tokens[1:, None])[:, 0].double().numpy()
            for pos in range(s.tokens.size):
                turn, within = divmod(pos, N_CTX + N_GEN)
                if within < N_CTX or turn not in TRAINED_TURNS[name]:
                    continue  # context, or a token another session of the tree trains
                rollout = float(s.rollout_log_probs[pos - s.response_start])
                tis = min(np.exp(logp_T[pos - 1] - rollout), 2.0)
                expected += (1 / 33) * tis * -EXPECTED_TURN_ADVANTAGES[name][turn]
    backend = TorchBackend(tmp_path / "train", model="tiny-qwen3", seed=0, lr=1e-3)
    backend.resume(store.runs.get(run_name), None)
    metrics = backend.train_step(batch)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_generate_rollout_hands_slime_one_sample_per_node(
    store: EventStore, run_name: str, db_url: str, slime_on_path: None
) -> None:
    """slime's rollout function on a tree run: the tree estimator, one sample per trained node."""
    build_tree_run(store, run_name)
    args = slime_args(run_name, db_url, rollout_batch_size=1, global_batch_size=None)
    nested, flat, metrics = call_like_slime(args, 0)
    assert metrics["dressage/trainable_tokens"] == 33 == sum(sum(s.loss_mask) for s in flat)
    got = sorted(
        (s.metadata["dressage_session"].removeprefix(f"{run_name}-"), s.reward, sum(s.loss_mask))
        for s in flat
    )
    nodes = [("R", 0.125, 6), ("R", 0.375, 6), ("A", -0.125, 3), ("A", -0.5, 3), ("B", -0.125, 6)]
    assert got == sorted([*nodes, ("C", 0.5, 3), ("S", -0.5, 6)])
    (group,) = nested
    assert len(group) == 5  # one trajectory per session, its node samples sharing its rollout_id


def test_megatron_packing_carries_each_tokens_node_advantage(store: EventStore, run_name: str) -> None:
    """The THD pack puts each response token's own (node) advantage on its predicting position."""
    from dressage.training.megatron_pack import pack_thd

    build_tree_run(store, run_name)
    batch = _step(store, run_name)
    assert batch is not None
    packed = pack_thd(batch.samples)
    for s, start, length in zip(batch.samples, packed.cu_seqlens[:-1], packed.seqlens, strict=True):
        r0 = int(start) + int(length) - 1 - s.response_length
        assert s.advantages is not None
        np.testing.assert_array_equal(packed.advantages_T[r0 : r0 + s.response_length], s.advantages)
