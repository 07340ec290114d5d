"""Per-token training decisions: ``train_token_decisions`` (one row per trained sample of a step).

For each sample (one segment) a step trains, the trainer records its advantage (a scalar: it is
broadcast to every token), why each response token is masked (``mask_reasons``: one small-int code
per token, the codes of the ``mask_reasons`` table; 0 = trained) and, when the backend computed
them, the truncated importance weights it multiplied each token's loss by (float32 per token, 0
where the token is not trained). They are written in the step's transaction
(:meth:`~dressage.store.consumers.ConsumerRepository.commit_step`); the ``token_decisions`` view
(:func:`dressage.store.views.token_decisions_view`) joins them to ``token_events``, one row per token
of the sample's segment (tokens before ``response_start`` are the prompt, code 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Row, select

from dressage.errors import InvalidRecordError
from dressage.store import schema as t

PROMPT_CODE = 1
"""The ``mask_reasons`` code of tokens before a sample's response (fixed: the views use it)."""


@dataclass(frozen=True)
class SampleDecision:
    """What a step decided for the ``R`` response tokens of one trained sample."""

    sample: int
    session_id: str
    segment_index: int
    response_start: int
    advantage: float
    mask_reasons: np.ndarray  # [R] codes (uint8)
    importance_weights: np.ndarray | None  # [R] float32, or None when the backend computed none

    def row(self) -> dict[str, object]:
        """The table row (without the step's keys); arrays of different lengths raise."""
        codes = np.asarray(self.mask_reasons)
        weights = self.importance_weights
        if weights is not None and np.asarray(weights).shape != codes.shape:
            raise InvalidRecordError(
                f"sample {self.sample}: {np.asarray(weights).shape[0]} importance weights for "
                f"{codes.shape[0]} mask reasons"
            )
        return {
            "sample": self.sample,
            "session_id": self.session_id,
            "segment_index": self.segment_index,
            "response_start": self.response_start,
            "advantage": float(self.advantage),
            "mask_reasons": codes.astype(np.int16).tolist(),
            "importance_weights": None if weights is None else short_floats(np.asarray(weights)),
        }


def short_floats(values_R: np.ndarray) -> list[float]:
    """float32 values as the shortest decimals that read back as the same float32 (compact JSON on
    SQLite; PostgreSQL's ``real`` rounds each to the same float32)."""
    return [float(str(v)) for v in values_R.astype(np.float32)]


def decision_rows(decisions: Sequence[SampleDecision]) -> list[dict[str, object]]:
    """Rows of ``train_token_decisions`` (without the step's keys), checked."""
    return [d.row() for d in decisions]


def read_decisions(conn: Connection, run_id: int, consumer: str) -> dict[int, list[SampleDecision]]:
    """Every recorded decision of ``consumer`` in run ``run_id``, by step, in sample order."""
    d = t.train_token_decisions.c
    rows = conn.execute(
        select(t.train_token_decisions)
        .where(d.run_id == run_id, d.consumer == consumer)
        .order_by(d.step, d.sample)
    ).all()
    out: dict[int, list[SampleDecision]] = {}
    for row in rows:
        out.setdefault(int(row.step), []).append(_decision(row))
    return out


def _decision(row: Row[tuple[object, ...]]) -> SampleDecision:
    weights = row.importance_weights
    return SampleDecision(
        sample=int(row.sample),
        session_id=str(row.session_id),
        segment_index=int(row.segment_index),
        response_start=int(row.response_start),
        advantage=float(row.advantage),
        mask_reasons=np.asarray(row.mask_reasons, dtype=np.uint8),
        importance_weights=None if weights is None else np.asarray(weights, dtype=np.float32),
    )


@dataclass(frozen=True)
class SegmentDecision:
    """The decision of one step about one segment of a session (what the viewer colours by)."""

    consumer: str
    step: int
    decision: SampleDecision


def read_session_decisions(conn: Connection, session_id: str) -> dict[int, SegmentDecision]:
    """Per segment of ``session_id``, the first recorded decision about it (by consumer, then step):
    a segment trained by several consumers shows the first one's."""
    d = t.train_token_decisions.c
    rows = conn.execute(
        select(t.train_token_decisions).where(d.session_id == session_id).order_by(d.consumer, d.step)
    ).all()
    out: dict[int, SegmentDecision] = {}
    for row in rows:
        if int(row.segment_index) not in out:
            out[int(row.segment_index)] = SegmentDecision(str(row.consumer), int(row.step), _decision(row))
    return out
