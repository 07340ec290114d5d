"""Tree rollouts: engine tokens generated and prefill tokens sent, a tree versus independent samples.

Real ``dressage-worker rollout`` processes run a multi-turn tool loop (the whitebox coding agent in
a bwrap sandbox, 7 LLM calls: write a module, run it, write its test, run it, ...) against a
scripted engine on loopback that counts, per request, the prompt tokens it was sent (prefill) and
the tokens it generated. In the same run, on the same tasks:

* ``tree``: one root per task, ``branching: {width: W, depth: D, at: turns, turns: [2, 4, ...]}``
  (level ``l`` forks at turn ``2 (l + 1)``): each branch's first ``K`` turns are replayed from the
  log (no engine request), turn ``K`` on is live;
* two baselines without branching: as many independent samples per task as the tree has sessions
  (trajectories: the same amount of training data), and ``W * D`` independent samples per task.

It prints each run's sessions, engine requests, generated and prefill tokens, and the ratios
tree / baseline. The counts are exact (the engine's replies are a function of the prompt), so
one pass is the measurement; no timing is compared.

    python bench/tree.py [--width 2] [--depth 2] [--tasks 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.rollout helpers

import yaml
from fastapi import Request
from fastapi.responses import Response
from rich.console import Console
from rich.table import Table

from tests.rollout.conftest import open_store, start_worker, write_config, write_tasks
from tests.rollout.resume_harness import PLAN, reply_for
from tests.scripted_engine import ScriptedEngine


class CountingEngine(ScriptedEngine):
    """The scripted engine, counting each request's prompt tokens and generated tokens."""

    def __init__(self) -> None:
        super().__init__(lambda prompt, n, sampling: reply_for(prompt.count("<tool_response>")))
        self.lock = threading.Lock()
        self.requests: list[tuple[int, int]] = []  # (prompt tokens, generated tokens)
        self._prompt_len = 0

    async def _generate(self, request: Request) -> Response:
        body = await request.json()  # starlette caches the body: the parent reads it again
        with self.lock:
            self._prompt_len = len(body["input_ids"])
        return await super()._generate(request)

    def _reply_ids(self, prompt: str, max_new: int, sampling: Mapping[str, Any]) -> tuple[list[int], str]:
        ids, finish = super()._reply_ids(prompt, max_new, sampling)
        with self.lock:
            self.requests.append((self._prompt_len, len(ids)))
        return ids, finish

    def take(self) -> list[tuple[int, int]]:
        """The requests counted since the last call."""
        with self.lock:
            out, self.requests = self.requests, []
        return out


@dataclass
class Measured:
    """One run's counts at the engine."""

    sessions: int
    requests: int
    generated: int
    prefill: int


def run_once(
    tmp: Path, engine: CountingEngine, tasks: int, n: int, branching: dict[str, Any] | None
) -> Measured:
    """One ``dressage-worker rollout`` of ``tasks`` coding tasks x ``n`` samples, counted at the engine."""
    tmp.mkdir(parents=True, exist_ok=True)
    home = tmp / "home"
    prompt = "Task {}: write fib.py with a recursive fib(n) and a test for it."
    write_tasks(tmp / "tasks.jsonl", [{"prompt": prompt.format(i), "label": "ok"} for i in range(tasks)])
    sections: dict[str, Any] = {
        "n_samples_per_prompt": n,
        "agent": {"kind": "coding", "max_turns": len(PLAN) + 2},
        "sampling": {"max_tokens": 256, "enable_thinking": False, "seed": 1},
        "worker": {"concurrency": 2, "lease_s": 60, "max_attempts": 1, "session_timeout_s": 120},
    }
    if branching is not None:
        sections["branching"] = branching
    cfg = write_config(tmp, engine.url, **sections)
    url = f"sqlite:///{tmp / 'log.db'}"
    engine.take()
    proc = start_worker(["--config", str(cfg), "--database-url", url], home)
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the worker failed:\n{out.decode(errors='replace')[-3000:]}")
    counted = engine.take()
    store = open_store(url, home)
    try:
        sessions = store.sessions.list(yaml.safe_load(cfg.read_text())["run"])
        finished = sum(s.status == "finished" for s in sessions)
        if finished != len(sessions):
            raise SystemExit(f"{len(sessions) - finished} of {len(sessions)} sessions did not finish")
    finally:
        store.close()
    return Measured(len(sessions), len(counted), sum(g for _, g in counted), sum(p for p, _ in counted))


def main() -> None:
    """Run the tree and its baseline, print the table and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=2, help="branches per fork point (W)")
    ap.add_argument("--depth", type=int, default=2, help="levels of forks below the root (D)")
    ap.add_argument("--tasks", type=int, default=2, help="tasks (one tree each)")
    args = ap.parse_args()
    turns = [2 * (level + 1) for level in range(args.depth)]
    branching = {"width": args.width, "depth": args.depth, "at": "turns", "turns": turns}
    console = Console(width=140)
    with tempfile.TemporaryDirectory() as d, CountingEngine().running() as engine:
        tmp = Path(d)
        tree = run_once(tmp / "tree", engine, args.tasks, 1, branching)
        per_task = tree.sessions // args.tasks
        same = run_once(tmp / "same", engine, args.tasks, per_task, None)
        wd = args.width * args.depth
        flat = run_once(tmp / "wd", engine, args.tasks, wd, None)
    table = Table(
        title=f"{args.tasks} tasks, {len(PLAN) + 1}-call tool loop: a tree (W={args.width}, D={args.depth}, "
        f"fork turns {turns}, {per_task} sessions) vs independent samples"
    )
    for col in ("run", "sessions", "engine requests", "generated tokens", "prefill tokens sent"):
        table.add_column(col, justify="right")
    rows = (
        ("tree", tree),
        (f"{per_task} independent / task", same),
        (f"W*D = {wd} independent / task", flat),
    )
    for name, m in rows:
        table.add_row(name, str(m.sessions), str(m.requests), str(m.generated), str(m.prefill))
    for name, base in rows[1:]:
        table.add_row(
            f"tree / {name.split(' / ')[0]}",
            f"{tree.sessions / base.sessions:.3f}",
            f"{tree.requests / base.requests:.3f}",
            f"{tree.generated / base.generated:.3f}",
            f"{tree.prefill / base.prefill:.3f}",
        )
    console.print(table)
    console.print(
        "tree / N independent: the same number of trajectories; tree / W*D independent: the issue's "
        "baseline (fewer trajectories than the tree)."
    )


if __name__ == "__main__":
    try:
        main()
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"a worker ran past {e.timeout} s") from None
