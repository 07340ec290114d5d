"""Hand-computed checks of the training math: anchors, broadcast, weights, masking, experts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dressage.errors import TrainingError
from dressage.store.records import Turn
from dressage.training.advantages import assign_advantages, grpo
from dressage.training.masking import MaskingPolicy, apply_version_mask, group_outside_window
from dressage.training.materialize import Trajectory, build_segments, materialize_trajectory
from dressage.training.weights import prompt_equal_weights
from tests.training.builders import LAYERS, TOP_K, make_turn


def traj(reward: float, rid: int, group: int = 0) -> Trajectory:
    return Trajectory(f"s{rid}", reward, "completed", rid, group, rid)


def test_grpo_hand_computed() -> None:
    np.testing.assert_allclose(grpo(np.array([1.0, 0.0, 0.0, 1.0])), [0.5, -0.5, -0.5, 0.5])
    # std of [1, 0, 0, 1] is 0.5 -> (R - 0.5) / (0.5 + eps)
    np.testing.assert_allclose(
        grpo(np.array([1.0, 0.0, 0.0, 1.0]), std_normalize=True, eps=0.0), [1, -1, -1, 1]
    )
    np.testing.assert_allclose(grpo(np.array([3.0])), [0.0])


def subagent_trajectory() -> list:
    """Root segment 0 (turns 0, 2), subagent segment 1 (lineage 1, turn 1), subagent segment 2 last."""
    return [
        make_turn(0, 0, 0, 0, [1, 2, 3], [4, 5], experts_rows=4),
        make_turn(1, 1, 1, 0, [7, 8], [9], experts_rows=2),
        make_turn(2, 0, 0, 5, [6], [10, 11], experts_rows=3),
        make_turn(3, 2, 1, 0, [12], [13, 14], experts_rows=2),
    ]


def test_segments_concat_and_expert_assembly() -> None:
    segs = build_segments(subagent_trajectory())
    assert [s.segment_index for s in segs] == [0, 1, 2]
    root = segs[0]
    assert root.tokens_L.tolist() == [1, 2, 3, 4, 5, 6, 10, 11]
    assert root.generated_L.tolist() == [False, False, False, True, True, False, True, True]
    assert root.experts is not None and root.experts.shape == (7, LAYERS, TOP_K)  # len(tokens) - 1
    # second turn's first expert row is the route of the first turn's last generated token
    np.testing.assert_array_equal(root.experts[4], np.arange(3 * LAYERS * TOP_K).reshape(3, LAYERS, TOP_K)[0])


def test_anchor_is_last_root_segment_not_last_segment() -> None:
    samples = materialize_trajectory(subagent_trajectory(), traj(1.0, 7))
    anchors = [s for s in samples if s.is_anchor]
    assert [(s.segment_index, s.thread_index) for s in anchors] == [(0, 0)]
    assert {s.rollout_id for s in samples} == {7}
    root = samples[0]
    # response starts at the first trained token (index 3); context token 6 stays with mask 0, logprob 0
    assert root.response_length == 5
    assert root.loss_mask.tolist() == [1, 1, 0, 1, 1]
    np.testing.assert_allclose(root.rollout_log_probs, [-0.1, -0.2, 0.0, -0.1, -0.2], rtol=1e-6)


def _reason(turn: Turn, reason: str) -> Turn:
    return dataclasses.replace(turn, boundary_reason=reason)


def _anchor(turns: list[Turn]) -> tuple[int, int]:
    [anchor] = [s for s in materialize_trajectory(turns, traj(1.0, 0)) if s.is_anchor]
    return anchor.segment_index, anchor.thread_index


def test_anchor_skips_a_same_prompt_subagent_when_the_main_agent_resumes() -> None:
    # main (lineage 0) turns 0, 2, 4; a subagent with the main agent's system prompt (lineage 1,
    # new_conversation) turns 1, 3, 5 -- it came last, but the main agent resumed after it started
    turns = [
        make_turn(0, 0, 0, 0, [1], [2]),
        _reason(make_turn(1, 1, 1, 0, [3], [4]), "new_conversation"),
        make_turn(2, 0, 0, 2, [5], [6]),
        make_turn(3, 1, 1, 2, [7], [8]),
        make_turn(4, 0, 0, 4, [9], [10]),
        make_turn(5, 1, 1, 4, [11], [12]),
    ]
    assert _anchor(turns) == (0, 0)


def test_anchor_follows_a_compaction() -> None:
    # lineage 0 turns 0-1, then the history is rewritten (same system prompt, new first message):
    # lineage 1 starts after lineage 0's last turn and carries the final answer
    turns = [
        make_turn(0, 0, 0, 0, [1], [2]),
        make_turn(1, 0, 0, 2, [3], [4]),
        _reason(make_turn(2, 1, 1, 0, [5], [6]), "new_conversation"),
        make_turn(3, 1, 1, 2, [7], [8]),
    ]
    assert _anchor(turns) == (1, 1)
    # a different system prompt (new_context) never takes the root thread over, even when it is last
    turns[2] = _reason(turns[2], "new_context")
    assert _anchor(turns) == (0, 0)


def test_anchor_is_never_an_abandoned_turn() -> None:
    # turn 1 was abandoned by the client (dead-end segment 1 on lineage 0); the retry continued
    # segment 0 with turns 2 and 3
    turns = [
        make_turn(0, 0, 0, 0, [1], [2]),
        _reason(make_turn(1, 1, 0, 0, [1, 2, 3], [4]), "client_disconnected"),
        make_turn(2, 0, 0, 2, [3], [5]),
        make_turn(3, 0, 0, 4, [6], [7]),
    ]
    assert _anchor(turns) == (0, 0)
    samples = materialize_trajectory(turns, traj(1.0, 0))
    assert sorted(s.segment_index for s in samples) == [0, 1]  # the dead end is still a sample


def test_anchor_is_the_segment_of_the_last_root_turn() -> None:
    # a regeneration branched the root lineage (segment 1, turns 1-2); the agent went back to
    # segment 0 for its final turn 3: segment 0 holds the final answer although segment 1 began later
    turns = [
        make_turn(0, 0, 0, 0, [1], [2]),
        make_turn(1, 1, 0, 0, [1, 9], [8]),
        make_turn(2, 1, 0, 3, [7], [6]),
        make_turn(3, 0, 0, 2, [3], [4]),
    ]
    assert _anchor(turns) == (0, 0)


def test_broadcast_advantage_to_all_segments() -> None:
    group = materialize_trajectory(subagent_trajectory(), traj(1.0, 0))
    group += materialize_trajectory([make_turn(0, 0, 0, 0, [1], [2, 3])], traj(0.0, 1))
    adv = assign_advantages(group, "grpo")
    assert adv == {0: 0.5, 1: -0.5}
    assert [s.advantage for s in group] == [0.5, 0.5, 0.5, -0.5]


def test_no_root_lineage_is_an_error() -> None:
    with pytest.raises(TrainingError, match="root-lineage"):
        materialize_trajectory([make_turn(0, 0, 1, 0, [1], [2])], traj(1.0, 0))


def test_non_linear_segment_is_an_error() -> None:
    turns = [make_turn(0, 0, 0, 0, [1], [2]), make_turn(1, 0, 0, 5, [3], [4])]
    with pytest.raises(TrainingError, match="segment_offset 5"):
        build_segments(turns)


def test_turn_without_experts_gives_none() -> None:
    turns = [make_turn(0, 0, 0, 0, [1], [2], experts_rows=1), make_turn(1, 0, 0, 2, [3], [4])]
    assert build_segments(turns)[0].experts is None


def test_prompt_equal_weights_one_step() -> None:
    # prompt 0: masks [1,1,0] and [1] -> N_0 = 3; prompt 1: [1,1] -> N_1 = 2; P = 2
    masks = [np.array([1, 1, 0]), np.array([1]), np.array([1, 1])]
    w = prompt_equal_weights(masks, [0, 0, 1])
    np.testing.assert_allclose(w[0], [1 / 6, 1 / 6, 0])
    np.testing.assert_allclose(w[1], [1 / 6])
    np.testing.assert_allclose(w[2], [1 / 4, 1 / 4])
    assert sum(x.sum() for x in w) == pytest.approx(1.0)


def test_splitting_into_k_steps_does_not_scale_the_loss() -> None:
    masks = [np.array([1, 1, 0]), np.array([1]), np.array([1, 1]), np.array([1, 1, 1, 1])]
    prompts = [0, 0, 1, 2]
    per_token_loss = 0.7
    whole = sum((w * per_token_loss).sum() for w in prompt_equal_weights(masks, prompts))
    # k = 3 optimizer steps, one prompt each: every step's loss equals the whole batch's
    steps = [[0, 1], [2], [3]]
    for idx in steps:
        w = prompt_equal_weights([masks[i] for i in idx], [prompts[i] for i in idx])
        assert sum((x * per_token_loss).sum() for x in w) == pytest.approx(whole)
    assert whole == pytest.approx(per_token_loss)


def test_version_masking() -> None:
    s = materialize_trajectory(
        [make_turn(0, 0, 0, 0, [1], [2, 3, 4, 5], versions=[3, 4, 5, 5])], traj(1.0, 0)
    )[0]
    apply_version_mask(s, MaskingPolicy(max_staleness=1), trainer_version=5)
    assert s.loss_mask.tolist() == [0, 1, 1, 1]  # version 3 < 5 - 1
    assert s.masking == {"recorded_trainable": 4, "masked_stale": 1, "trainable": 3}
    apply_version_mask(s, MaskingPolicy(max_staleness=1, last_version_only=True), trainer_version=5)
    assert s.loss_mask.tolist() == [0, 0, 1, 1]
    assert s.masking["masked_not_last_version"] == 1
    assert group_outside_window([s], MaskingPolicy(group_version_window=1), 5) == 3
    assert group_outside_window([s], MaskingPolicy(group_version_window=2), 5) is None


def test_pack_thd_layout() -> None:
    from dressage.training.megatron_pack import pack_thd
    from dressage.training.weights import assign_loss_weights

    a = materialize_trajectory([make_turn(0, 0, 0, 0, [1, 2], [3, 4, 5])], traj(1.0, 0))[0]
    b = materialize_trajectory([make_turn(0, 0, 0, 0, [6], [7])], traj(0.0, 1, group=1))[0]
    assign_loss_weights([a, b])
    p = pack_thd([a, b], pad_multiple=4)
    assert p.cu_seqlens.tolist() == [0, 8, 12] and p.seqlens.tolist() == [5, 2]
    assert p.tokens_T.tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 0, 0]
    assert p.labels_T[:5].tolist() == [2, 3, 4, 5, -100]
    # a's response tokens 3, 4, 5 are predicted at positions 1, 2, 3; weights 1/(2*3) each
    np.testing.assert_allclose(p.loss_weights_T[:5], [0, 1 / 6, 1 / 6, 1 / 6, 0])
    np.testing.assert_allclose(p.loss_weights_T[8:10], [0.5, 0])
    assert p.position_ids_T[8:12].tolist() == [0, 1, 2, 3]
