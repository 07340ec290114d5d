"""Per-token decisions benchmark: bytes per trained token in ``train_token_decisions``, both backends.

Builds the synthetic run of ``bench/materialize.py`` (``--groups`` x ``--n`` sessions of ``--turns``
turns, ~``--tokens`` tokens each), then per backend trains it twice with real steps (the trainer's
own formation, masking, advantages and commit):

* consumer ``none``: the ``none`` backend (as slime's rollout side): advantage and mask reasons,
  no importance weights;
* consumer ``weighted``: a backend that sets every trained token's importance weight to
  ``min(exp(d), 2)`` with ``d ~ N(0, 0.05)`` (the spread of a trainer near its behaviour policy;
  float32 values with full mantissas, the worst case for SQLite's JSON text).

It reports the table's bytes (PostgreSQL: ``pg_total_relation_size``, TOAST and index included;
SQLite: the pages ``dbstat`` counts for the table and its index) per trained token and per
response token, and the ratio to the bytes per token the ``turns`` table itself takes (the
baseline, measured in the same database). Then the ``token_decisions`` view's read of one
session against ``token_events``' read of it (cold: first query; warm: best of ``--repeat``).

    python bench/decisions.py [--pg-url URL] [--backends postgresql,sqlite] [--groups 16] [--n 8]
        [--turns 3] [--tokens 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
import uuid

import numpy as np
from bench_db import bench_store
from materialize import add_run_options, build, run_args
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from dressage.store import EventStore
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training import NullBackend, StepOptions, Trainer
from dressage.training.steps import StepBatch

console = Console()


class WeightingBackend:
    """Sets importance weights on every sample the way a trainer would (see the module docstring)."""

    name = "bench-weights"

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Nothing to restore."""

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """Weights on trained tokens, 0 elsewhere."""
        for s in batch.samples:
            tis = np.minimum(np.exp(self.rng.normal(0, 0.05, s.response_length)), 2.0)
            s.importance_weights = (tis * s.loss_mask).astype(np.float32)
        return {}


def table_bytes(store: EventStore, table: str) -> int:
    """Bytes ``table`` takes with its indexes (PostgreSQL: and TOAST)."""
    with store.db.engine.connect() as conn:
        if store.db.dialect == "postgresql":
            return int(conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar_one())
        return int(
            conn.execute(
                text("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = :t OR name LIKE :ix"),
                {"t": table, "ix": f"ix_{table}_%"},
            ).scalar_one()
        )


def timed(store: EventStore, query: str, session: str, repeat: int) -> tuple[float, float, int]:
    """(cold seconds, warm best seconds, rows) of ``query`` for one session, client-side."""
    times, rows = [], 0
    for _ in range(repeat + 1):
        with store.db.engine.connect() as conn:
            t0 = time.perf_counter()
            rows = len(conn.execute(text(query), {"s": session}).all())
            times.append(time.perf_counter() - t0)
    return times[0], min(times[1:]), rows


def measure(store: EventStore, run: str, args: argparse.Namespace) -> dict[str, float]:
    options = StepOptions(global_batch_size=min(8, args.groups) * args.n, n_samples_per_prompt=args.n)
    out: dict[str, float] = {"turns": table_bytes(store, "turns")}
    with store.db.engine.connect() as conn:
        out["tokens"] = float(
            conn.execute(text("SELECT SUM(n_context + n_generated) FROM turns")).scalar_one()
        )
    for consumer, backend in (("none", NullBackend()), ("weighted", WeightingBackend())):
        before = table_bytes(store, "train_token_decisions")
        results = Trainer(store, run, options, backend, consumer=consumer).run_steps()  # type: ignore[arg-type]
        out[f"{consumer}_bytes"] = table_bytes(store, "train_token_decisions") - before
        out[f"{consumer}_trained"] = sum(s.n_trainable for r in results for s in r.batch.samples)
        out[f"{consumer}_response"] = sum(s.response_length for r in results for s in r.batch.samples)
    session = f"{run}-0-0"
    view = "SELECT * FROM token_decisions WHERE session_id = :s AND consumer = 'train:weighted'"
    base = "SELECT * FROM token_events WHERE session_id = :s"
    out["view_cold"], out["view_warm"], out["view_rows"] = timed(store, view, session, args.repeat)
    out["base_cold"], out["base_warm"], _ = timed(store, base, session, args.repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, tokens=2000)
    ap.add_argument("--repeat", type=int, default=5, help="warm queries (the best counts)")
    ap.set_defaults(groups=16)
    args = run_args(ap)
    table = Table(
        title=f"decisions {args.groups}x{args.n} sessions, {args.turns} turns, ~{args.tokens} tokens"
    )
    for col in (
        "backend",
        "consumer",
        "trained tokens",
        "B/trained token",
        "B/response token",
        "turns B/token",
        "ratio to turns",
        "view / token_events cold",
        "warm",
    ):
        table.add_column(col, justify="right")
    for backend in args.backends.split(","):
        with bench_store(backend, args.pg_url) as store:
            run = f"bench-{uuid.uuid4().hex[:8]}"
            build(store, run, args)
            m = measure(store, run, args)
        turns_per_token = m["turns"] / m["tokens"]
        for consumer in ("none", "weighted"):
            per_trained = m[f"{consumer}_bytes"] / m[f"{consumer}_trained"]
            table.add_row(
                backend,
                consumer,
                f"{int(m[f'{consumer}_trained']):,}",
                f"{per_trained:.2f}",
                f"{m[f'{consumer}_bytes'] / m[f'{consumer}_response']:.2f}",
                f"{turns_per_token:.2f}",
                f"{per_trained / turns_per_token:.2f}",
                f"{m['view_cold'] / m['base_cold']:.2f}" if consumer == "weighted" else "",
                f"{m['view_warm'] / m['base_warm']:.2f}" if consumer == "weighted" else "",
            )
    console.print(table)


if __name__ == "__main__":
    main()
