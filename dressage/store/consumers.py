"""Exactly-once effect for log consumers (the trainer is ``train:<name>``).

Delivery is at-least-once; a consumer records each optimizer step's manifest and its new
checkpoint (position, step) in one transaction, so after a crash it resumes at the step after the
last one committed. Committing the same step again with the same batch hash is a no-op; with a
different hash it is non-determinism and raises.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, update

from dressage.errors import IdempotencyConflictError, InvalidRecordError
from dressage.store import schema as t
from dressage.store.database import Database
from dressage.store.decisions import (
    SampleDecision,
    SegmentDecision,
    decision_rows,
    read_decisions,
    read_session_decisions,
)
from dressage.store.records import ConsumerCheckpoint, Run, TrainStep, canonical_json, check_text
from dressage.store.runs import RunRepository


class ConsumerRepository:
    """Consumer checkpoints and step manifests."""

    def __init__(self, db: Database, runs: RunRepository) -> None:
        self.db = db
        self.runs = runs

    def checkpoint(self, run: str | Run, consumer: str) -> ConsumerCheckpoint | None:
        """The consumer's last committed checkpoint, or None before its first step."""
        r = self.runs.get(run)
        c = t.consumer_checkpoints.c
        with self.db.read() as conn:
            row = conn.execute(
                select(t.consumer_checkpoints).where(c.run_id == r.id, c.consumer == consumer)
            ).first()
        return ConsumerCheckpoint(row.consumer, row.position, row.step, row.state or {}) if row else None

    def commit_step(
        self,
        run: str | Run,
        consumer: str,
        *,
        step: int,
        position: int,
        batch_hash: str,
        manifest: Mapping[str, Any],
        state: Mapping[str, Any] | None = None,
        start_step: int = 0,
        metrics: Mapping[str, float] | None = None,
        decisions: Sequence[SampleDecision] = (),
    ) -> TrainStep:
        """Record step ``step``'s manifest and move the checkpoint to ``position`` atomically.

        Steps are consecutive from ``start_step + 1`` (a consumer whose weights were trained
        ``start_step`` steps elsewhere starts there; ``start_step`` counts only for its first
        commit). Re-committing a recorded step with the same ``batch_hash`` returns it unchanged
        (a retried commit); a different hash raises. ``metrics`` (name -> number: loss, grad norm...)
        go to ``train_step_metrics`` in the same transaction, so a committed step always has them;
        so do ``decisions`` (each trained sample's advantage, mask reasons and importance weights:
        ``train_token_decisions``, :mod:`dressage.store.decisions`).
        """
        check_text(consumer, what="consumer name", max_chars=200)
        if step < 1 or position < 0 or start_step < 0:
            raise InvalidRecordError(
                f"step must be >= 1, position and start_step >= 0, got step={step} position={position} "
                f"start_step={start_step}"
            )
        r = self.runs.get(run)
        manifest = dict(manifest)
        state = dict(state or {})
        canonical_json(manifest, what=f"manifest of step {step}", max_bytes=self.db.max_payload_bytes * 4)
        canonical_json(state, what="consumer state", max_bytes=self.db.max_payload_bytes)
        pending = _PendingStep(
            r.id,
            r.name,
            consumer,
            step,
            position,
            batch_hash,
            start_step,
            manifest,
            state,
            _metric_rows(metrics or {}),
            decision_rows(decisions),
        )

        def tx(conn: Connection) -> TrainStep:
            recorded = pending.recorded(conn)
            if recorded is not None:
                return recorded
            return pending.write(conn, pending.check_next(conn))

        return self.db.retrying(tx)

    def steps(self, run: str | Run, consumer: str) -> list[TrainStep]:
        """Every recorded step of ``consumer``, in order."""
        r = self.runs.get(run)
        s = t.train_steps.c
        with self.db.read() as conn:
            rows = conn.execute(
                select(t.train_steps).where(s.run_id == r.id, s.consumer == consumer).order_by(s.step)
            ).all()
        return [_step(x) for x in rows]

    def metrics(self, run: str | Run, consumer: str) -> dict[int, dict[str, float]]:
        """Every recorded step's metrics, by step (NaN where SQLite stored NULL for a NaN)."""
        r = self.runs.get(run)
        m = t.train_step_metrics.c
        out: dict[int, dict[str, float]] = {}
        with self.db.read() as conn:
            rows = conn.execute(
                select(m.step, m.name, m.value)
                .where(m.run_id == r.id, m.consumer == consumer)
                .order_by(m.step, m.name)
            ).all()
        for step, name, value in rows:
            out.setdefault(int(step), {})[str(name)] = float("nan") if value is None else float(value)
        return out

    def decisions(self, run: str | Run, consumer: str) -> dict[int, list[SampleDecision]]:
        """Every recorded step's per-sample decisions (advantage, mask reasons, importance weights)."""
        r = self.runs.get(run)
        with self.db.read() as conn:
            return read_decisions(conn, r.id, consumer)

    def session_decisions(self, session_id: str) -> dict[int, SegmentDecision]:
        """Per segment of a session, the first step's decision about it (none: never trained)."""
        with self.db.read() as conn:
            return read_session_decisions(conn, session_id)


@dataclass(frozen=True)
class _PendingStep:
    """A step :meth:`ConsumerRepository.commit_step` records, with the checks its transaction makes."""

    run_id: int
    run_name: str
    consumer: str
    step: int
    position: int
    batch_hash: str
    start_step: int
    manifest: dict[str, object]
    state: dict[str, object]
    metric_rows: list[dict[str, object]]
    decision_rows: list[dict[str, object]]

    def recorded(self, conn: Connection) -> TrainStep | None:
        """The step as recorded before (a retried commit), or None; a different batch hash raises."""
        s = t.train_steps.c
        existing = conn.execute(
            select(t.train_steps).where(
                s.run_id == self.run_id, s.consumer == self.consumer, s.step == self.step
            )
        ).first()
        if existing is not None and existing.batch_hash != self.batch_hash:
            raise IdempotencyConflictError(
                f"{self.consumer} step {self.step} of run {self.run_name!r} was recorded with batch hash "
                f"{existing.batch_hash[:12]}, now {self.batch_hash[:12]}: materialization is not deterministic"
            )
        return _step(existing) if existing is not None else None

    def check_next(self, conn: Connection) -> bool:
        """Whether the consumer has a checkpoint; it must be this step's predecessor (or, without
        one, ``start_step`` must be)."""
        c = t.consumer_checkpoints.c
        current = conn.execute(
            select(c.step, c.position).where(c.run_id == self.run_id, c.consumer == self.consumer)
        ).first()
        last_step = current.step if current else self.start_step
        if self.step != last_step + 1:
            raise InvalidRecordError(
                f"{self.consumer} is at step {last_step}; the next step must be {last_step + 1}, not {self.step}"
            )
        if current is not None and self.position < current.position:
            raise InvalidRecordError(
                f"{self.consumer} checkpoint cannot move back from {current.position} to {self.position}"
            )
        return current is not None

    def write(self, conn: Connection, has_checkpoint: bool) -> TrainStep:
        """Insert the step, its metrics and decisions; move the checkpoint (inserted on the first step)."""
        now = time.time()
        key = {"run_id": self.run_id, "consumer": self.consumer}
        step = {"step": self.step, "position": self.position}
        row = {**key, **step, "batch_hash": self.batch_hash, "manifest": self.manifest, "created_at": now}
        conn.execute(insert(t.train_steps).values(**row))
        if self.metric_rows:
            conn.execute(
                insert(t.train_step_metrics), [{**key, "step": self.step, **m} for m in self.metric_rows]
            )
        if self.decision_rows:
            conn.execute(
                insert(t.train_token_decisions),
                [{**key, "step": self.step, **d} for d in self.decision_rows],
            )
        values = {**step, "state": self.state, "updated_at": now}
        if not has_checkpoint:
            conn.execute(insert(t.consumer_checkpoints).values(**key, **values))
        else:
            c = t.consumer_checkpoints.c
            conn.execute(
                update(t.consumer_checkpoints)
                .where(c.run_id == self.run_id, c.consumer == self.consumer)
                .values(**values)
            )
        return TrainStep(self.consumer, self.step, self.position, self.batch_hash, self.manifest, now)


def _metric_rows(metrics: Mapping[str, float]) -> list[dict[str, Any]]:
    """Rows of ``train_step_metrics`` (without the step's keys); bad names or values raise."""
    rows = []
    for name, value in metrics.items():
        check_text(name, what="metric name", max_chars=64)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRecordError(f"metric {name!r} must be a number, got {type(value).__name__}")
        value = float(value)
        rows.append({"name": name, "value": None if math.isnan(value) else value})
    return rows


def _step(row: Any) -> TrainStep:
    return TrainStep(row.consumer, row.step, row.position, row.batch_hash, row.manifest, row.created_at)
