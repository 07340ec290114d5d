"""Evaluation from the log: eval tasks per policy version, and their results read back.

A run whose config has an ``eval:`` section (:class:`~dressage.rollout.config.EvalConfig`) gets,
for each new policy version ``v`` the workers see (every ``eval.every``-th), the eval dataset's
tasks enqueued as eval tasks of version ``v`` (``tasks.kind = 'eval'``, ``tasks.eval_version = v``,
task indexes ``v * n_eval + i``). Workers run them like training tasks (same agent, sandbox,
reward; sessions carry ``info.eval_version``); the trainer never trains on them. An eval round
is **complete** when every (task, sample) pair of its version is terminal (``done`` or ``failed``);
its rewards are those of its finished sessions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dressage.agents.base import Task
from dressage.rollout.config import EvalConfig
from dressage.rollout.datasets import load_tasks
from dressage.store import EventStore, Run, Session, TaskSpec

TERMINAL_STATES = ("done", "failed")


def eval_specs(tasks: Sequence[Task], version: int) -> list[TaskSpec]:
    """The eval dataset as version ``version``'s eval tasks (indexes ``version * n + i``)."""
    n = len(tasks)
    return [
        TaskSpec(task_index=version * n + t.index, payload={**t.to_payload(), "index": version * n + t.index})
        for t in tasks
    ]


class EvalScheduler:
    """Enqueues the eval round of each new policy version a worker sees (idempotent across workers)."""

    def __init__(
        self,
        store: EventStore,
        run: Run,
        cfg: EvalConfig,
        *,
        min_interval_s: float = 0.5,
        provider: str = "bwrap",
    ) -> None:
        self.store, self.run, self.cfg = store, run, cfg
        self.tasks = load_tasks(cfg.dataset.path, cfg.dataset.limit, provider, cfg.dataset.loader)
        self.seen: int | None = None
        self.min_interval_s = min_interval_s
        self._checked_at = -float("inf")

    def enqueue(self, version: int) -> int:
        """Enqueue version ``version``'s round when the cadence asks for it; returns pairs added."""
        self.seen = version if self.seen is None else max(self.seen, version)
        if version % self.cfg.every:
            return 0
        return self.store.tasks.enqueue(
            self.run, eval_specs(self.tasks, version), self.cfg.n_samples_per_prompt, eval_version=version
        )

    def tick(self) -> int:
        """Enqueue the round of the newest recorded policy version (0 before any) if it is new.

        Looks at the log at most every ``min_interval_s`` seconds (the lease loop calls it often).
        """
        now = time.monotonic()
        if now - self._checked_at < self.min_interval_s:
            return 0
        self._checked_at = now
        version = self.store.versions.latest(self.run) or 0
        if self.seen is not None and version <= self.seen:
            return 0
        return self.enqueue(version)


@dataclass
class EvalRound:
    """One policy version's eval round as the log holds it."""

    version: int
    pairs: int = 0
    terminal: int = 0
    sessions: list[Session] = field(default_factory=list)  # finished, in (task, sample) order

    @property
    def complete(self) -> bool:
        """Every (task, sample) pair of the round is done or failed."""
        return self.pairs > 0 and self.terminal == self.pairs

    @property
    def rewards(self) -> list[float]:
        """Rewards of the finished sessions."""
        return [float(s.reward) for s in self.sessions if s.reward is not None]

    @property
    def mean_reward(self) -> float | None:
        """Mean reward of the finished sessions (None before the first)."""
        r = self.rewards
        return float(np.mean(r)) if r else None

    @property
    def reward_stderr(self) -> float:
        """Standard error of the mean reward (0 with fewer than two sessions)."""
        r = self.rewards
        return float(np.std(r, ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0


def read_eval_rounds(store: EventStore, run: str | Run) -> list[EvalRound]:
    """Every eval round of the run, by policy version, from the tasks and sessions of the log."""
    r = store.runs.get(run)
    states = store.tasks.states(r, kind="eval")
    if not states:
        return []
    finished: dict[int, Session] = {}
    for s in store.sessions.list(r, status="finished"):
        if s.task_id is not None:
            finished[s.task_id] = s
    rounds: dict[int, EvalRound] = {}
    for st in states:
        assert st.eval_version is not None
        rnd = rounds.setdefault(st.eval_version, EvalRound(st.eval_version))
        rnd.pairs += 1
        rnd.terminal += st.state in TERMINAL_STATES
        if st.task_id in finished:
            rnd.sessions.append(finished[st.task_id])
    return [rounds[v] for v in sorted(rounds)]


def eval_line(rounds: Sequence[EvalRound], name: str = "eval") -> str:
    """``eval reward per policy version: v0 0.41, v1 0.47 (3/4 done)`` for logs and docs."""
    parts = []
    for rnd in rounds:
        mean = "-" if rnd.mean_reward is None else f"{rnd.mean_reward:.3f}"
        todo = "" if rnd.complete else f" ({rnd.terminal}/{rnd.pairs} done)"
        parts.append(f"v{rnd.version} {mean}{todo}")
    return f"{name} reward per policy version: " + (", ".join(parts) or "none yet")
