"""Viewer benchmark: the run page of a run with many sessions (the sessions table pages on the server).

Builds, per backend, one run of ``--sessions`` sessions (``--sessions / 4`` tasks x 4 samples, each
session one short turn and a reward; a tenth of them failed), serves the viewer on loopback as
``dressage-worker view`` does, and measures the run page (counts, reward curves, failures, one page
of 50 sessions) served over loopback, best and median of ``--repeat`` warm rounds, for:
the default order, sorted by reward (descending), sorted by tokens (a turn aggregate over every
session), filtered by status, the last page, and a text search. Baseline, same run:
``list_sessions``, the store's read of the run's sessions (what a page that is not paginated on
the server would have to read at least); the ratio page / baseline says what the page costs
against it.

    python bench/view_run.py [--pg-url URL] [--backends sqlite,postgresql] [--sessions 10000]
        [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.loopback

import httpx
import numpy as np
from bench_db import migrated_database
from rich.console import Console
from rich.table import Table

from dressage.config import Settings
from dressage.store import EventStore, NewTurn
from dressage.store.records import TaskSpec
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from dressage.view.server import ViewServer
from tests.loopback import ThreadedServer

console = Console(width=200)
SAMPLES = 4


def build_run(store: EventStore, run: str, n_sessions: int) -> None:
    """``n_sessions`` sessions of ``n_sessions / SAMPLES`` tasks, one short turn each."""
    store.runs.create(run)
    n_tasks = max(1, n_sessions // SAMPLES)
    store.tasks.enqueue(run, [TaskSpec(i, {"prompt": f"task {i}"}) for i in range(n_tasks)], SAMPLES)
    rng = np.random.default_rng(0)
    done = 0
    while leases := store.tasks.claim(run, "bench", n=500, lease_s=3600):
        for lease in leases:
            s = store.sessions.open(run, task_id=lease.task_id, agent="bench")
            n_gen = int(rng.integers(4, 40))
            store.turns.append(
                run,
                NewTurn(
                    session_id=s.id,
                    turn_index=0,
                    context_ids=rng.integers(0, 1000, 30),
                    generated_ids=rng.integers(0, 1000, n_gen),
                    logprobs=-rng.exponential(0.5, n_gen).astype(np.float32),
                    policy_versions=[0] * n_gen,
                    finish_reason="stop",
                ),
            )
            if done % 10 == 9:
                store.sessions.finalize(s.id, "failed", finish_reason="agent_crashed", error="boom")
            else:
                store.sessions.finalize(s.id, "finished", reward=float(rng.random()), finish_reason="stop")
            store.tasks.release(lease, "done")
            done += 1


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


PAGES = {
    "default": {},
    "sort reward desc": {"sort": "reward", "order": "desc"},
    "sort tokens desc": {"sort": "tokens", "order": "desc"},
    "status failed": {"status": "failed"},
    "last page": {"page": "last"},
    "text search": {"text": "task 7"},
}


def measure(backend: str, a: argparse.Namespace) -> list[list[str]]:
    """One backend's rows: the baseline, then one per page."""
    with migrated_database(backend, a.pg_url) as url, tempfile.TemporaryDirectory() as home:
        settings = Settings(database_url=url, home=Path(home))
        writer = EventStore.open(settings=settings)
        t0 = time.perf_counter()
        build_run(writer, "bench", a.sessions)
        built = time.perf_counter() - t0
        n = len(writer.sessions.list("bench"))
        writer.close()
        store = open_readonly_store(settings)
        app = create_app(store)
        server = ThreadedServer(app, server=lambda config: ViewServer(config, app.state.live))
        server.start()
        rows = []
        try:
            base = timed(lambda: store.sessions.list("bench"), a.repeat)
            bmed = statistics.median(base)
            rows.append(
                [
                    backend,
                    f"list_sessions (baseline), {n:,} sessions built in {built:.0f} s",
                    "",
                    _ms(base),
                    "",
                ]
            )
            last = (n + 49) // 50
            with httpx.Client(base_url=server.base, timeout=120) as client:
                for name, params in PAGES.items():
                    q = {"name": "bench", **params}
                    if q.get("page") == "last":
                        q["page"] = str(last)
                    r = client.get("/run", params=q)  # warm-up
                    r.raise_for_status()
                    kb = len(r.content) / 1024
                    t = timed(lambda q=q: client.get("/run", params=q).raise_for_status(), a.repeat)
                    rows.append([backend, name, f"{kb:,.0f}", _ms(t), f"{statistics.median(t) / bmed:.2f}x"])
        finally:
            server.stop()
            store.close()
    return rows


def _ms(values: list[float]) -> str:
    return f"{min(values) * 1000:,.0f} / {statistics.median(values) * 1000:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    table = Table(title=f"run page of a run with {a.sessions:,} sessions, served (best / median ms)")
    for col in ("backend", "page", "page KB", "served", "vs baseline"):
        table.add_column(col)
    for backend in a.backends.split(","):
        for row in measure(backend, a):
            table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
