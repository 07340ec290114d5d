"""Exactly-once effect for log consumers (the trainer is ``train:<name>``).

Delivery is at-least-once; a consumer records each optimizer step's manifest and its new
checkpoint (position, step) in one transaction, so after a crash it resumes at the step after the
last one committed. Committing the same step again with the same batch hash is a no-op; with a
different hash it is non-determinism and raises.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, insert, select, update

from dressage.errors import IdempotencyConflictError, InvalidRecordError
from dressage.store import schema as t
from dressage.store.database import Database
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
    ) -> TrainStep:
        """Record step ``step``'s manifest and move the checkpoint to ``position`` atomically.

        Steps are consecutive from ``start_step + 1`` (a consumer whose weights were trained
        ``start_step`` steps elsewhere starts there; ``start_step`` counts only for its first
        commit). Re-committing a recorded step with the same ``batch_hash`` returns it unchanged
        (a retried commit); a different hash raises. ``metrics`` (name -> number: loss, grad norm...)
        go to ``train_step_metrics`` in the same transaction, so a committed step always has them.
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
        metric_rows = _metric_rows(metrics or {})
        c = t.consumer_checkpoints.c
        s = t.train_steps.c

        def tx(conn: Connection) -> TrainStep:
            existing = conn.execute(
                select(t.train_steps).where(s.run_id == r.id, s.consumer == consumer, s.step == step)
            ).first()
            if existing is not None:
                if existing.batch_hash != batch_hash:
                    raise IdempotencyConflictError(
                        f"{consumer} step {step} of run {r.name!r} was recorded with batch hash "
                        f"{existing.batch_hash[:12]}, now {batch_hash[:12]}: materialization is not deterministic"
                    )
                return _step(existing)
            current = conn.execute(
                select(c.step, c.position).where(c.run_id == r.id, c.consumer == consumer)
            ).first()
            last_step = current.step if current else start_step
            if step != last_step + 1:
                raise InvalidRecordError(
                    f"{consumer} is at step {last_step}; the next step must be {last_step + 1}, not {step}"
                )
            if current is not None and position < current.position:
                raise InvalidRecordError(
                    f"{consumer} checkpoint cannot move back from {current.position} to {position}"
                )
            now = time.time()
            row = {
                "run_id": r.id,
                "consumer": consumer,
                "step": step,
                "position": position,
                "batch_hash": batch_hash,
                "manifest": manifest,
                "created_at": now,
            }
            conn.execute(insert(t.train_steps).values(**row))
            if metric_rows:
                conn.execute(
                    insert(t.train_step_metrics),
                    [{"run_id": r.id, "consumer": consumer, "step": step, **m} for m in metric_rows],
                )
            values = {"position": position, "step": step, "state": state, "updated_at": now}
            if current is None:
                conn.execute(insert(t.consumer_checkpoints).values(run_id=r.id, consumer=consumer, **values))
            else:
                conn.execute(
                    update(t.consumer_checkpoints)
                    .where(c.run_id == r.id, c.consumer == consumer)
                    .values(**values)
                )
            return TrainStep(consumer, step, position, batch_hash, manifest, now)

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
