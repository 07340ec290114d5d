"""Materialization benchmark of the replay trainer against loading slime's own rollout pickle.

Builds a synthetic run through :class:`EventStore` (``--groups`` tasks x ``--n`` samples, each a
multi-turn session of ``--turns`` turns and about ``--tokens`` tokens, routed experts optional),
then, per backend (PostgreSQL, SQLite), in the same process:

* ``materialize``: the trainer's own path: :class:`GroupTracker` polls ready groups and
  :meth:`StepBuilder.form` forms every step (read turns, segments, samples, advantages, masking,
  prompt-equal weights, manifest and batch hash) — samples/s and tokens/s (all tokens of every
  sample);
* of that, ``read_turns``: the store's share (:meth:`EventStore.turns.read` of every group);
* ``slime torch.load``: ``torch.load`` of the ``{rollout_id}.pt`` files the ``slime-dump`` backend
  wrote for the same steps (what slime's ``--load-debug-rollout-data`` does).

Each measurement runs ``--repeat`` rounds and keeps its best; the first round is printed too (cold:
a fresh builder, its connections and reader threads not yet started). It prints the ratio
materialize / torch.load, whether the targets hold on PostgreSQL (issue 25: >= 10M tokens/s and
>= 1.5x ``torch.load``), and the machine's load average before and after: a figure from a busy
machine says so. Machines are shared and noisy: compare the ratios.

    python bench/materialize.py [--pg-url URL] [--backends postgresql,sqlite] [--groups 64] [--n 8]
        [--turns 3] [--tokens 3000] [--experts 8x2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from bench_db import add_database_options, bench_store
from rich.console import Console
from rich.table import Table

from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.training.groups import START_CURSOR, GroupTracker
from dressage.training.steps import StepBuilder, StepOptions

console = Console()
TARGET_TOKENS_S = 10e6
TARGET_VS_LOAD = 1.5


def session_turns(
    sid: str, rng: np.random.Generator, turns: int, tokens: int, experts: tuple[int, int] | None
) -> list[NewTurn]:
    """One linear segment of ``turns`` turns (prompt, then tool outputs + generations), ~``tokens`` long."""
    per_turn = tokens // turns
    records, offset = [], 0
    for i in range(turns):
        n_ctx = per_turn // 2 if i == 0 else per_turn // 4
        n_gen = per_turn - n_ctx
        rows = n_ctx + n_gen - (0 if offset else 1)
        routed = None
        if experts is not None:
            routed = rng.integers(0, 64, (rows, *experts), dtype=np.uint8)
        records.append(
            NewTurn(
                session_id=sid,
                turn_index=i,
                context_ids=rng.integers(0, 248_000, n_ctx, dtype=np.int32),
                generated_ids=rng.integers(0, 248_000, n_gen, dtype=np.int32),
                logprobs=-rng.random(n_gen, dtype=np.float32),
                policy_versions=np.zeros(n_gen, dtype=np.int32),
                route="append" if offset else "create",
                segment_offset=offset,
                routed_experts=routed,
                finish_reason="stop",
            )
        )
        offset += n_ctx + n_gen
    return records


def build(store: EventStore, run: str, args: argparse.Namespace) -> None:
    """Enqueue, claim and play every (task, sample) as one finished session."""
    rng = np.random.default_rng(0)
    store.runs.create(run)
    store.tasks.enqueue(run, [TaskSpec(i, {"prompt": i}) for i in range(args.groups)], n_samples=args.n)
    while leases := store.tasks.claim(run, "bench", n=64):
        for lease in leases:
            sid = f"{run}-{lease.task_index}-{lease.sample_index}"
            store.sessions.open(run, session_id=sid, task_id=lease.task_id, attempt=lease.attempt)
            for rec in session_turns(sid, rng, args.turns, args.tokens, args.experts):
                store.turns.append(run, rec)
            store.sessions.finalize(sid, "finished", reward=float(rng.random() < 0.5))
            store.tasks.release(lease, "done")


def measure(store: EventStore, run: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """Time the trainer's materialization, its read_turns share, and torch.load of the slime dump."""
    import torch

    from dressage.integrations.slime import SlimeDumpBackend

    options = StepOptions(global_batch_size=args.steps_groups * args.n, n_samples_per_prompt=args.n)
    r = store.runs.get(run)
    rounds = []
    for _ in range(args.repeat):  # best round: noise on a shared machine only slows a round down
        builder = StepBuilder(store, r, options)
        t0 = time.perf_counter()
        pending = GroupTracker(store, r, args.n).poll()
        batches, cursor, step = [], START_CURSOR, 0
        while (batch := builder.form(step + 1, pending, cursor)) is not None:
            batches.append(batch)
            pending, cursor, step = pending[batch.consumed :], batch.cursor, batch.step
        rounds.append(time.perf_counter() - t0)
    t_mat, t_cold = min(rounds), rounds[0]
    samples = [s for b in batches for s in b.samples]
    tokens = sum(int(s.tokens.size) for s in samples)

    sessions = [[m.session_id for m in g.members] for g in GroupTracker(store, r, args.n).poll()]
    t_read = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for ids in sessions:
            store.turns.read(session_ids=ids)
        t_read = min(t_read, time.perf_counter() - t0)

    dump = SlimeDumpBackend(out / run)
    dump.resume(r, None)
    for b in batches:
        dump.train_step(b)
    files = sorted((out / run).glob("*.pt"))
    size = sum(f.stat().st_size for f in files)
    t_load = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        loaded = [torch.load(f, weights_only=False) for f in files]
        t_load = min(t_load, time.perf_counter() - t0)
    assert sum(len(d["samples"]) for d in loaded) == len(samples)
    return {
        "samples": len(samples),
        "tokens": tokens,
        "t_mat": t_mat,
        "t_cold": t_cold,
        "t_read": t_read,
        "t_load": t_load,
        "dump_mb": size / 1e6,
    }


def add_run_options(ap: argparse.ArgumentParser, tokens: int) -> None:
    """The synthetic run's shape, as :func:`build` reads it (``--experts`` parsed by :func:`run_args`)."""
    add_database_options(ap)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per group")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=tokens, help="tokens per session")
    ap.add_argument("--experts", default=None, help="LAYERSxTOP_K routed experts per token, e.g. 8x2")


def run_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line; ``--experts 8x2`` becomes ``(8, 2)``."""
    args = ap.parse_args()
    args.experts = tuple(int(x) for x in args.experts.split("x")) if args.experts else None
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, tokens=3000)
    ap.add_argument("--steps-groups", type=int, default=8, help="groups per optimizer step")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per measurement (the best round counts)")
    args = run_args(ap)

    table = Table(
        title=f"materialize {args.groups}x{args.n} sessions, {args.turns} turns, ~{args.tokens} tokens"
    )
    for col in (
        "backend",
        "samples/s",
        "Mtokens/s",
        "read_turns share",
        "torch.load Mtok/s",
        "ours / torch.load",
    ):
        table.add_column(col, justify="right")
    load_before = os.getloadavg()
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            with bench_store(backend, args.pg_url) as store:
                run = f"bench-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                build(store, run, args)
                console.print(f"{backend}: built the run in {time.perf_counter() - t0:.1f}s")
                m = measure(store, run, args, Path(tmp))
            ours, theirs = m["tokens"] / m["t_mat"], m["tokens"] / m["t_load"]
            table.add_row(
                backend,
                f"{m['samples'] / m['t_mat']:,.0f}",
                f"{ours / 1e6:.2f}",
                f"{m['t_read'] / m['t_mat']:.0%}",
                f"{theirs / 1e6:.2f}",
                f"{ours / theirs:.2f}x",
            )
            console.print(
                f"{backend}: {m['samples']} samples, {m['tokens']:,} tokens; materialize {m['t_mat']:.3f}s "
                f"(read_turns {m['t_read']:.3f}s), torch.load {m['t_load']:.3f}s of {m['dump_mb']:.1f} MB; "
                f"cold (first round) {m['tokens'] / m['t_cold'] / 1e6:.2f}M tokens/s"
            )
            if backend == "postgresql":
                verdicts += target_lines(ours, ours / theirs)
    console.print(table)
    for line in verdicts:
        console.print(line)
    console.print(
        f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, after "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
    )


def target_lines(tokens_s: float, vs_load: float) -> list[str]:
    """Issue 25's materialization targets on PostgreSQL, each met or NOT met."""
    return [
        f"TARGET materialize on PostgreSQL >= {TARGET_TOKENS_S / 1e6:.0f}M tokens/s: {tokens_s / 1e6:.2f}M "
        f"({'met' if tokens_s >= TARGET_TOKENS_S else 'NOT met'})",
        f"TARGET materialize on PostgreSQL >= {TARGET_VS_LOAD}x torch.load: {vs_load:.2f}x "
        f"({'met' if vs_load >= TARGET_VS_LOAD else 'NOT met'})",
    ]


if __name__ == "__main__":
    main()
