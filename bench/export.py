"""Export benchmark: Parquet export throughput and bytes per token, PostgreSQL vs Parquet.

Builds the synthetic run of ``bench/materialize.py`` (``--groups`` x ``--n`` sessions of ``--turns``
turns, ~``--tokens`` tokens each: 64 x 8 x 2,000 = ~1M tokens by default, routed experts optional),
then per backend: ``export_run`` (best of ``--repeat`` rounds) as tokens/s, and the bytes per token
of the run in the database (PostgreSQL: ``pg_total_relation_size`` of ``turns`` + ``events``, the
bench database holds only this run; SQLite: the file) against the export's Parquet files (all of
them, and ``turns.parquet`` alone). Machines are shared and noisy: compare within one run.

    python bench/export.py [--pg-url URL] [--backends postgresql,sqlite] [--groups 64] [--n 8]
        [--turns 3] [--tokens 2000] [--experts 8x2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from bench_db import bench_store
from materialize import add_run_options, build, run_args
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from dressage.exports.export import export_run
from dressage.store import EventStore

console = Console()


def database_bytes(store: EventStore) -> int:
    """Bytes the run takes in the database (tables with their indexes and TOAST)."""
    if store.db.dialect == "postgresql":
        with store.db.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT pg_total_relation_size('turns') + pg_total_relation_size('events')")
                ).scalar_one()
            )
    return Path(str(store.db.engine.url.database)).stat().st_size


def measure(store: EventStore, run: str, out: Path, repeat: int) -> dict[str, float]:
    best = float("inf")
    manifest: dict = {}
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        manifest = export_run(store, run, out)
        best = min(best, time.perf_counter() - t0)
    files = manifest["files"]
    return {
        "tokens": manifest["counts"]["tokens"],
        "seconds": best,
        "parquet": sum(f["bytes"] for f in files.values()),
        "turns_parquet": files["turns.parquet"]["bytes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(ap, tokens=2000)
    ap.add_argument("--repeat", type=int, default=2, help="export rounds (the best counts)")
    args = run_args(ap)

    table = Table(
        title=f"export {args.groups}x{args.n} sessions, ~{args.tokens} tokens, experts {args.experts}"
    )
    for col in (
        "backend",
        "tokens",
        "export Mtok/s",
        "db B/token",
        "parquet B/token",
        "turns.parquet B/token",
    ):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            with bench_store(backend, args.pg_url) as store:
                run = f"bench-{uuid.uuid4().hex[:8]}"
                build(store, run, args)
                db_bytes = database_bytes(store)
                m = measure(store, run, Path(tmp) / f"export-{backend}", args.repeat)
            tok = m["tokens"]
            table.add_row(
                backend,
                f"{tok:,}",
                f"{tok / m['seconds'] / 1e6:.2f}",
                f"{db_bytes / tok:.2f}",
                f"{m['parquet'] / tok:.2f}",
                f"{m['turns_parquet'] / tok:.2f}",
            )
    console.print(table)


if __name__ == "__main__":
    main()
