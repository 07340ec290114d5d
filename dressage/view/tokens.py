"""The token view of a session: each segment's exact token stream as compact arrays for the page.

Per turn the page gets parallel arrays (one entry per piece, a piece being the ids that decode to
whole characters): ``t`` text, ``k`` kind (0 context, 1 generated and trained, 2 generated with
loss mask 0), ``lp`` the lowest logprob in the piece (None for context), ``v`` policy version,
``id`` the first id and ``n`` the number of ids; ``p0`` is the segment position of the turn's first
id (a piece's position is ``p0`` plus the ids before it: a turn's ids are contiguous in its
segment); ``chars`` and ``lines`` (line breaks) size the turn's block before it is drawn. The page's script turns
each turn into spans coloured by logprob (or by policy version) when the turn is scrolled near
(a 30k-token session is 30k spans: drawn all at load they cost most of a second), and shows details
on hover; routed experts are fetched per position on demand (``/api/experts``), so a 30k-token page
does not carry a ``[tokens, layers, top_k]`` array.

A segment that a step trained also carries that step's decisions (``train_token_decisions``): per
piece ``m``, the mask reason code of its first id (:data:`~dressage.training.masking.MASK_REASONS`)
and ``w``, its importance weight (None when not recorded); per segment its advantage. The page can
then colour by advantage (trained tokens, by the sign and size of their sample's advantage) or by
mask reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.redact import REDACTED, secret_spans
from dressage.store.decisions import PROMPT_CODE, SampleDecision, SegmentDecision
from dressage.store.records import Turn
from dressage.training.masking import MASK_REASONS
from dressage.view.decode import TokenDecoder


@dataclass(frozen=True)
class SegmentSummary:
    """One segment (one training sample): where it starts, why, and its size."""

    index: int
    thread: int
    route: str
    boundary_reason: str | None
    first_turn: int
    last_turn: int
    parent_turn: int | None
    n_tokens: int
    n_trained: int
    versions: str

    @property
    def dead_end(self) -> bool:
        """A turn the client abandoned (recorded as a side segment, never trained)."""
        return self.boundary_reason == "client_disconnected"

    @property
    def opened_by(self) -> str:
        """Why the segment exists, in words: the first segment, a branch (retry), a new thread..."""
        if self.dead_end:
            return "abandoned by the client"
        if self.route == "branch":
            return "branch (retry/regeneration)"
        if self.first_turn == 0 and self.route == "create" and not self.boundary_reason:
            return "start"
        if self.route == "create":
            return "new context (compaction or subagent)"
        return "append"


def segment_summaries(turns: list[Turn]) -> list[SegmentSummary]:
    """One summary per segment, in segment order."""
    index_of = {t.id: t.turn_index for t in turns}
    by_segment: dict[int, list[Turn]] = {}
    for turn in turns:
        by_segment.setdefault(turn.segment_index, []).append(turn)
    out = []
    for index, group in sorted(by_segment.items()):
        group.sort(key=lambda x: x.turn_index)
        first = group[0]
        versions = np.concatenate([t.policy_versions for t in group])
        out.append(
            SegmentSummary(
                index=index,
                thread=first.thread_index,
                route=first.route,
                boundary_reason=first.boundary_reason,
                first_turn=first.turn_index,
                last_turn=group[-1].turn_index,
                parent_turn=index_of.get(first.parent_turn_id) if first.parent_turn_id else None,
                n_tokens=sum(t.context_ids.size + t.generated_ids.size for t in group),
                n_trained=sum(int(t.loss_mask.sum()) for t in group),
                versions=_range(versions),
            )
        )
    return out


def _range(values: np.ndarray) -> str:
    if not values.size:
        return "-"
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def piece_decisions(
    decision: SampleDecision, positions: np.ndarray
) -> tuple[list[int | None], list[float | None]]:
    """The mask reason code and importance weight at each segment position of ``positions``."""
    rel = positions - decision.response_start
    codes = np.asarray(decision.mask_reasons)
    inside = (rel >= 0) & (rel < codes.size)
    m: list[int | None] = [
        int(codes[r]) if ok else (PROMPT_CODE if r < 0 else None) for r, ok in zip(rel, inside, strict=True)
    ]
    weights = decision.importance_weights
    w: list[float | None] = [
        round(float(weights[r]), 4) if ok and weights is not None else None
        for r, ok in zip(rel, inside, strict=True)
    ]
    return m, w


def turn_tokens(
    turn: Turn,
    decoder: TokenDecoder,
    secrets: tuple[str, ...] = (),
    *,
    has_experts: bool = False,
    decision: SampleDecision | None = None,
) -> dict[str, Any]:
    """The piece arrays of one turn (see the module docstring); secrets in its text are redacted."""
    ctx_texts, ctx_starts = decoder.pieces(turn.context_ids)
    gen_texts, gen_starts = decoder.pieces(turn.generated_ids)
    n_ctx, n_gen = int(turn.context_ids.size), int(turn.generated_ids.size)
    k: list[int] = [0] * len(ctx_texts)
    lp: list[float | None] = [None] * len(ctx_texts)
    v: list[int | None] = [None] * len(ctx_texts)
    if n_gen:
        trained = np.logical_and.reduceat(turn.loss_mask.astype(bool), gen_starts)
        k += np.where(trained, 1, 2).tolist()
        low = np.minimum.reduceat(turn.logprobs.astype(np.float64), gen_starts)
        lp += np.round(np.nan_to_num(low, nan=-99.0, neginf=-99.0), 4).tolist()
        v += turn.policy_versions[gen_starts].tolist()
    ids: list[int | None] = [*turn.context_ids[ctx_starts].tolist(), *turn.generated_ids[gen_starts].tolist()]
    sizes = np.diff(np.append(ctx_starts, n_ctx)).tolist() + np.diff(np.append(gen_starts, n_gen)).tolist()
    texts = ctx_texts + gen_texts
    _redact_pieces(texts, ids, secrets)
    extra: dict[str, list[int | None] | list[float | None]] = {}
    if decision is not None:
        starts = np.concatenate([np.asarray(ctx_starts), n_ctx + np.asarray(gen_starts)]).astype(np.int64)
        extra["m"], extra["w"] = piece_decisions(decision, turn.segment_offset + starts)
    return {
        **extra,
        "turn": turn.turn_index,
        "segment": turn.segment_index,
        "t": texts,
        "k": k,
        "lp": lp,
        "v": v,
        "id": ids,
        "n": sizes,
        "p0": turn.segment_offset,
        "chars": sum(map(len, texts)),
        "lines": sum(t.count("\n") for t in texts),
        "experts": has_experts or turn.routed_experts is not None,
    }


def _redact_pieces(texts: list[str], ids: list[int | None], secrets: tuple[str, ...]) -> None:
    """Replace pieces that overlap a secret (which may span pieces) by ``[REDACTED]`` and no id."""
    spans = secret_spans("".join(texts), secrets)
    if not spans:
        return
    pos = 0
    span_i = 0
    for i, text in enumerate(texts):
        start, end = pos, pos + len(text)
        pos = end
        while span_i < len(spans) and spans[span_i][1] <= start:
            span_i += 1
        if span_i < len(spans) and spans[span_i][0] < end and start < spans[span_i][1]:
            first = spans[span_i][0] >= start
            texts[i] = REDACTED if first else ""
            ids[i] = None


def token_payload(
    turns: list[Turn],
    decoder: TokenDecoder,
    secrets: tuple[str, ...] = (),
    *,
    with_experts: frozenset[int] | set[int] = frozenset(),
    decisions: dict[int, SegmentDecision] | None = None,
    nodes: dict[int, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The token view of a session: every turn's pieces, grouped by segment in segment order.

    ``with_experts``: turn indexes whose routed experts the log holds (read without the blobs).
    ``decisions``: per trained segment, a step's decisions about it (the page's colour by advantage
    and by mask reason; ``trained`` is true when there is any). ``nodes``: per segment trained in a
    tree, its nodes (``first_turn``, ``end_turn``, ``turns``, ``advantage``, ``shared``): the
    segment head lists them and each turn's tokens take their node's advantage (``a``).
    """
    decisions, nodes = decisions or {}, nodes or {}
    by_segment: dict[int, list[dict[str, Any]]] = {}
    for turn in sorted(turns, key=lambda x: (x.segment_index, x.turn_index)):
        chosen = decisions.get(turn.segment_index)
        pieces = turn_tokens(
            turn,
            decoder,
            secrets,
            has_experts=turn.turn_index in with_experts,
            decision=chosen.decision if chosen else None,
        )
        node = next(
            (
                n
                for n in nodes.get(turn.segment_index, ())
                if n["first_turn"] <= turn.turn_index < n["end_turn"]
            ),
            None,
        )
        if node is not None:
            pieces["a"] = node["advantage"]
        by_segment.setdefault(turn.segment_index, []).append(pieces)
    versions = {int(v) for t in turns for v in np.unique(t.policy_versions)}
    advantages = [abs(d.decision.advantage) for d in decisions.values()]
    advantages += [abs(n["advantage"]) for ns in nodes.values() for n in ns]
    return {
        "segments": [
            {"index": i, "turns": ts, "trained": _trained_by(decisions.get(i), nodes.get(i))}
            for i, ts in sorted(by_segment.items())
        ],
        "trained": bool(decisions),
        "reasons": [name for name, _ in MASK_REASONS],
        "max_advantage": max(advantages, default=0.0),
        "pieces": sum(len(t["t"]) for ts in by_segment.values() for t in ts),
        "versions": sorted(versions),
        "decoded": decoder.available,
    }


def _trained_by(
    chosen: SegmentDecision | None, nodes: list[dict[str, Any]] | None
) -> dict[str, object] | None:
    """What the segment head says about the step that trained the segment (None: not trained): its
    advantage, or its tree nodes' when a tree trained it (one advantage per node)."""
    if chosen is None:
        return None
    return {
        "consumer": chosen.consumer,
        "step": chosen.step,
        "advantage": chosen.decision.advantage,
        "nodes": nodes or [],
    }


def experts_at(turns: list[Turn], segment: int, position: int) -> list[list[int]] | None:
    """The routed experts ``[layers][top_k]`` of the token at ``position`` of ``segment``, or None.

    Turn ``j`` stores rows for positions ``max(offset_j - 1, 0) .. offset_j + n_j - 2`` (see
    :mod:`dressage.training.materialize`): the route of each token that predicts a next one.
    """
    for turn in turns:
        if turn.segment_index != segment or turn.routed_experts is None:
            continue
        first = max(turn.segment_offset - 1, 0)
        row = position - first
        if 0 <= row < turn.routed_experts.shape[0]:
            return [[int(x) for x in layer] for layer in turn.routed_experts[row]]
    return None
