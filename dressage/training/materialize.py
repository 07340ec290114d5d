"""Turns of a finished trajectory → segments → :class:`TrainSample` s (one per segment).

A segment's tokens are the concatenation, in ``turn_index`` order, of each turn's
``context_ids + generated_ids``; each turn's ``segment_offset`` must equal the number of the
segment's tokens before it (segments are linear chains, anything else is a log bug).

Routed experts: turn ``j`` of a segment stores rows for token positions
``max(offset_j - 1, 0) .. offset_j + n_ctx_j + n_gen_j - 2``, so concatenating them gives
``[L - 1, layers, top_k]`` (the route of every token that predicts a next one). One turn
without experts makes the whole sample's experts ``None``.

The response starts at the segment's first trained token (``loss_mask`` 1 as recorded); context
tokens after it stay in the response with ``loss_mask`` 0 and ``rollout_log_probs`` 0.0.

The **anchor** of a trajectory is the main agent's final answer: the segment holding the last turn
of the *root thread*, never a subagent's segment that merely came last. The root thread starts as
lineage 0. A lineage the proxy opened with ``new_conversation`` (same system prompt and tools, a
different first message: a compaction or a subagent) takes the root thread over when it starts
after the root's last turn, i.e. the main agent never resumed: that is a compaction (or a resumed
session whose agent diverged from its recorded turns: ``replay_diverged``). A subagent
that runs while the main agent continues never does. Dead-end segments (``client_disconnected``:
a turn the client abandoned, retried elsewhere) are samples but never the anchor. One case stays
ambiguous: a main agent whose very last act is to start a same-prompt subagent, with no main-agent
call after it, reads as a compaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dressage.errors import TrainingError
from dressage.store.records import Turn
from dressage.training.samples import TrainSample

ROOT_LINEAGE = 0
CONTINUATION_REASONS = frozenset({"new_conversation", "replay_diverged"})
"""Boundary reasons of a lineage that may continue the root thread: a compaction, or a resumed
session's live run after its replay diverged (see :mod:`dressage.proxy.replay`)."""
DEAD_END_REASONS = frozenset({"client_disconnected"})
"""Boundary reasons of segments that are never the anchor (abandoned turns)."""


@dataclass(frozen=True)
class Trajectory:
    """What materialization needs to know about one finished session besides its turns."""

    session_id: str
    reward: float
    status: str  # slime Sample.Status value
    index: int
    group_index: int
    rollout_id: int


@dataclass
class Segment:
    """The concatenated per-token arrays of one segment (``L`` tokens)."""

    session_id: str
    segment_index: int
    thread_index: int
    turn_ids: list[str]
    tokens_L: np.ndarray  # int32
    generated_L: np.ndarray  # bool: the policy sampled this token
    logprobs_L: np.ndarray  # float32, 0.0 on context tokens
    mask_L: np.ndarray  # bool, the recorded loss mask (False on context tokens)
    versions_L: np.ndarray  # int32, -1 on context tokens
    experts: np.ndarray | None  # [L-1, layers, top_k] int32
    last_finish_reason: str | None
    first_turn_index: int
    last_turn_index: int
    boundary_reason: str | None  # of the segment's first turn


def build_segments(turns: Sequence[Turn]) -> list[Segment]:
    """Group one session's turns into segments, in order of each segment's first turn."""
    by_segment: dict[int, list[Turn]] = {}
    for turn in sorted(turns, key=lambda x: x.turn_index):
        by_segment.setdefault(turn.segment_index, []).append(turn)
    return [_concat(seg_turns) for seg_turns in by_segment.values()]


def _concat(turns: list[Turn]) -> Segment:
    first = turns[0]
    where = f"session {first.session_id} segment {first.segment_index}"
    _check_chain(turns, where)
    sizes = [(t.context_ids.size, t.generated_ids.size) for t in turns]
    length = sum(c + g for c, g in sizes)
    tokens = np.empty(length, np.int32)
    generated = np.zeros(length, np.bool_)
    logprobs = np.zeros(length, np.float32)
    mask = np.zeros(length, np.bool_)
    versions = np.full(length, -1, np.int32)
    n = 0
    for turn, (n_ctx, n_gen) in zip(turns, sizes, strict=True):
        gen = slice(n + n_ctx, n + n_ctx + n_gen)
        tokens[n : gen.start] = turn.context_ids
        tokens[gen] = turn.generated_ids
        generated[gen] = True
        logprobs[gen] = turn.logprobs
        mask[gen] = turn.loss_mask
        versions[gen] = turn.policy_versions
        n = gen.stop
    return Segment(
        session_id=first.session_id,
        segment_index=first.segment_index,
        thread_index=first.thread_index,
        turn_ids=[x.id for x in turns],
        tokens_L=tokens,
        generated_L=generated,
        logprobs_L=logprobs,
        mask_L=mask,
        versions_L=versions,
        experts=_segment_experts(turns, sizes, where),
        last_finish_reason=turns[-1].finish_reason,
        first_turn_index=first.turn_index,
        last_turn_index=turns[-1].turn_index,
        boundary_reason=first.boundary_reason,
    )


def _check_chain(turns: list[Turn], where: str) -> None:
    """Raise unless the turns are one lineage and each starts where the previous ones end."""
    first, n = turns[0], 0
    for turn in turns:
        if turn.thread_index != first.thread_index:
            raise TrainingError(
                f"{where}: turn {turn.turn_index} is on lineage {turn.thread_index}, the segment on "
                f"{first.thread_index}; a segment belongs to one lineage"
            )
        if turn.segment_offset != n:
            raise TrainingError(
                f"{where}: turn {turn.turn_index} has segment_offset {turn.segment_offset} but {n} tokens "
                "precede it; the segment is not a linear chain"
            )
        n += turn.context_ids.size + turn.generated_ids.size


def _segment_experts(turns: list[Turn], sizes: list[tuple[int, int]], where: str) -> np.ndarray | None:
    """The segment's ``[L - 1, layers, top_k]`` routed experts; None when a turn has none."""
    experts: list[np.ndarray] = []
    n = 0
    for turn, (n_ctx, n_gen) in zip(turns, sizes, strict=True):
        if turn.routed_experts is None:
            return None
        expected = n_ctx + n_gen - (1 if n == 0 else 0)
        if turn.routed_experts.shape[0] != expected:
            raise TrainingError(
                f"{where}: turn {turn.turn_index} has {turn.routed_experts.shape[0]} rows of routed "
                f"experts, expected {expected} (positions {max(n - 1, 0)}..{n + n_ctx + n_gen - 2})"
            )
        experts.append(turn.routed_experts)
        n += n_ctx + n_gen
    shapes = {e.shape[1:] for e in experts}
    if len(shapes) != 1:
        raise TrainingError(f"{where}: routed experts change shape between turns: {sorted(shapes)}")
    return np.concatenate(experts).astype(np.int32)


def anchor_position(segments: Sequence[Segment]) -> int | None:
    """Index in ``segments`` of the anchor (see the module docstring); None without a root lineage."""
    live = [(i, s) for i, s in enumerate(segments) if s.boundary_reason not in DEAD_END_REASONS]
    start: dict[int, tuple[int, str | None]] = {}  # lineage -> (first turn, its boundary reason)
    end: dict[int, int] = {}  # lineage -> last turn
    for _, seg in live:
        lineage = seg.thread_index
        if lineage not in start or seg.first_turn_index < start[lineage][0]:
            start[lineage] = (seg.first_turn_index, seg.boundary_reason)
        end[lineage] = max(end.get(lineage, -1), seg.last_turn_index)
    if ROOT_LINEAGE not in start:
        return None
    root = ROOT_LINEAGE
    for lineage, (first_turn, reason) in sorted(start.items(), key=lambda kv: kv[1][0]):
        if lineage != root and reason in CONTINUATION_REASONS and first_turn > end[root]:
            root = lineage  # the main agent never resumed its old context: a compaction
    return max((seg.last_turn_index, i) for i, seg in live if seg.thread_index == root)[1]


def segment_to_sample(seg: Segment, traj: Trajectory, *, is_anchor: bool) -> TrainSample | None:
    """The training sample of ``seg``; None when the policy generated nothing in it.

    ``response_start`` = the first recorded-trained token (else the first generated one), at least 1
    so every response token has a predicting position.
    """
    gen_idx = np.flatnonzero(seg.generated_L)
    if gen_idx.size == 0:
        return None
    trained_idx = np.flatnonzero(seg.mask_L)
    start = max(int(trained_idx[0] if trained_idx.size else gen_idx[0]), 1)
    length = int(seg.tokens_L.size)
    status = traj.status
    if status == "completed" and is_anchor and seg.last_finish_reason == "length":
        status = "truncated"
    return TrainSample(
        tokens=seg.tokens_L,
        response_length=length - start,
        loss_mask=seg.mask_L[start:].astype(np.int32),
        rollout_log_probs=seg.logprobs_L[start:].copy(),
        rollout_routed_experts=seg.experts,
        reward=float(traj.reward),
        status=status,
        index=traj.index,
        group_index=traj.group_index,
        rollout_id=traj.rollout_id,
        session_id=seg.session_id,
        segment_index=seg.segment_index,
        thread_index=seg.thread_index,
        is_anchor=is_anchor,
        turn_ids=seg.turn_ids,
        policy_versions=seg.versions_L[start:].copy(),
        stored_loss_mask=seg.mask_L[start:].copy(),
    )


def materialize_trajectory(turns: Sequence[Turn], traj: Trajectory) -> list[TrainSample]:
    """Every segment of one trajectory as samples; exactly one of them is the anchor.

    Raises :class:`TrainingError` when the trajectory has no root-lineage segment with generated
    tokens (there is nothing to attach its reward to).
    """
    segments = build_segments(turns)
    anchor = anchor_position(segments)
    if anchor is None:
        raise TrainingError(
            f"session {traj.session_id} has no root-lineage (lineage {ROOT_LINEAGE}) segment; "
            "its reward has no anchor"
        )
    samples: list[TrainSample] = []
    for i, seg in enumerate(segments):
        sample = segment_to_sample(seg, traj, is_anchor=i == anchor)
        if sample is None:
            if i == anchor:
                raise TrainingError(
                    f"session {traj.session_id}: the anchor segment {seg.segment_index} has no generated tokens"
                )
            continue
        samples.append(sample)
    return samples
