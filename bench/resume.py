"""In-flight resume benchmark: tokens generated again after a worker is killed halfway through a run.

A real ``dressage-worker rollout`` process runs one multi-turn coding task (the whitebox coding
agent in a bwrap sandbox, 7 LLM calls: write a module, run it, write its test, run it, ...) against
a scripted engine on loopback. The worker is killed with ``kill -9`` while it waits on the engine
for step 3 (three turns recorded), then ``dressage-worker rollout --resume`` finishes the run. Per
mode, in the same run:

* ``resume`` (``worker.resume_in_flight: true``, the default): the next attempt continues the
  session; the proxy answers the recorded turns from the log;
* ``restart`` (``resume_in_flight: false``, the old behaviour and the baseline): the interrupted
  session is abandoned and the task starts again.

It prints the engine requests and tokens generated after the resume for the steps already recorded
before the kill (goal: 0; baseline: all of them), the live ones, and whether the finished
trajectory equals an uninterrupted run's (same task, sample and seed) token for token.

    python bench/resume.py [--pg-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.rollout.resume_harness

from rich.console import Console
from rich.table import Table

from tests.rollout.resume_harness import PLAN, CodingScript, crash_and_resume, uninterrupted
from tests.scripted_engine import ScriptedEngine


class _Policy:
    def __init__(self) -> None:
        self.script = CodingScript(phase="reference")

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        return self.script(prompt, n, sampling)


@contextlib.contextmanager
def _databases(tmp: Path, pg_url: str | None) -> Iterator[list[tuple[str, str]]]:
    dbs = [("sqlite", f"sqlite:///{tmp / 'ref.db'}")]
    with contextlib.ExitStack() as stack:
        if pg_url:
            from bench_db import fresh_database

            try:
                db = stack.enter_context(fresh_database(pg_url))
                dbs.append(("postgresql", db.url))
            except Exception as e:  # no server: SQLite only
                print(f"PostgreSQL skipped: {e}", file=sys.stderr)
        yield dbs


def main() -> None:
    """Run both modes on each backend and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg-url", default=None, help="PostgreSQL admin URL (a fresh database is made)")
    ap.add_argument("--hold-at", type=int, default=len(PLAN) // 2, help="the step the worker is killed at")
    args = ap.parse_args()
    console = Console(width=140)
    policy = _Policy()
    table = Table(title=f"kill -9 at step {args.hold_at} of {len(PLAN) + 1}, then --resume")
    for col in (
        "backend",
        "mode",
        "recorded",
        "prefix reqs",
        "prefix tokens",
        "baseline tokens",
        "live reqs",
    ):
        table.add_column(col, justify="right")
    table.add_column("== uninterrupted")
    with tempfile.TemporaryDirectory() as d, ScriptedEngine(policy).running() as eng:
        tmp = Path(d)
        reference = uninterrupted(tmp / "reference", f"sqlite:///{tmp / 'reference.db'}", eng.url)
        with _databases(tmp, args.pg_url) as dbs:
            for backend, url in dbs:
                if backend == "sqlite":
                    url = f"sqlite:///{tmp / 'runs.db'}"
                rows = {}
                for mode, resume in (("restart", False), ("resume", True)):
                    script = policy.script = CodingScript(hold_at=args.hold_at)
                    rows[mode] = crash_and_resume(
                        tmp / f"{backend}-{mode}", url, script, eng.url, resume=resume
                    )
                baseline = rows["restart"].prefix_tokens
                for mode, out in rows.items():
                    table.add_row(
                        backend,
                        mode,
                        str(out.recorded_at_kill),
                        str(out.prefix_requests),
                        str(out.prefix_tokens),
                        str(baseline),
                        str(out.live_requests),
                        "yes" if out.trajectory == reference else "NO",
                    )
    console.print(table)
    console.print(
        "prefix: engine requests/tokens after the resume for the steps recorded before the kill "
        "(goal 0; baseline = the restart mode's). live: requests for the steps after them."
    )


if __name__ == "__main__":
    main()
