"""What each iteration of the RL loop did, read back from the log: a table, the numbers, a plot.

Everything here is computed from the run's log (sessions, turns, policy versions), not from the
loop's memory, so the numbers in the table are the ones anyone can re-derive with SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.table import Table

from dressage.rollout.evaluation import EvalRound
from dressage.store import EventStore, Run


@dataclass
class IterationStats:
    """One iteration: its rollout (sessions, rewards, token versions) and what training did after it."""

    iteration: int
    sessions: int = 0
    finished: int = 0
    mean_reward: float | None = None
    reward_stderr: float | None = None
    versions: tuple[int, ...] = ()
    turns_spanning_push: int = 0
    rollout_s: float = 0.0
    train_steps: int = 0
    pushed_version: int | None = None
    train_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def version_label(self) -> str:
        """``3`` or ``2-3`` (the versions the iteration's tokens were sampled with)."""
        if not self.versions:
            return "-"
        lo, hi = min(self.versions), max(self.versions)
        return str(lo) if lo == hi else f"{lo}-{hi}"


def iteration_of(task_index: int, n_tasks: int) -> int:
    """Iteration ``k`` enqueued the dataset's tasks as indexes ``k * n_tasks ... k * n_tasks + n - 1``."""
    return task_index // n_tasks


def read_iteration(store: EventStore, run: Run, iteration: int, n_tasks: int) -> IterationStats:
    """Rewards and per-token policy versions of iteration ``iteration``'s sessions, from the log."""
    stats = IterationStats(iteration)
    sessions = [
        s
        for s in store.sessions.list(run)
        if isinstance(s.info.get("task_index"), int)
        and "eval_version" not in s.info
        and iteration_of(int(s.info["task_index"]), n_tasks) == iteration
    ]
    stats.sessions = len(sessions)
    finished = [s for s in sessions if s.status == "finished" and s.reward is not None]
    stats.finished = len(finished)
    if finished:
        rewards = np.array([float(s.reward) for s in finished if s.reward is not None])
        stats.mean_reward = float(rewards.mean())
        stats.reward_stderr = float(rewards.std(ddof=1) / np.sqrt(len(rewards))) if len(rewards) > 1 else 0.0
    versions: set[int] = set()
    for turn in (
        store.turns.read(session_ids=[s.id for s in sessions], with_experts=False) if sessions else []
    ):
        v = turn.policy_versions[turn.policy_versions >= 0]
        versions.update(int(x) for x in np.unique(v))
        if len(np.unique(v)) > 1:
            stats.turns_spanning_push += 1
    stats.versions = tuple(sorted(versions))
    return stats


def summary_table(stats: list[IterationStats], *, title: str) -> Table:
    """The end-of-loop table: iteration, policy version, sessions, mean reward, training."""
    table = Table(title=title)
    for name, justify in (
        ("iteration", "right"),
        ("policy version", "center"),
        ("sessions", "right"),
        ("mean reward", "right"),
        ("turns across a push", "right"),
        ("rollout s", "right"),
        ("trained -> pushed", "center"),
        ("loss", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in stats:
        reward = "-" if s.mean_reward is None else f"{s.mean_reward:.3f} ± {s.reward_stderr or 0.0:.3f}"
        pushed = "-" if s.pushed_version is None else f"{s.train_steps} step(s) -> v{s.pushed_version}"
        loss = s.metrics.get("loss")
        table.add_row(
            str(s.iteration),
            s.version_label,
            f"{s.finished}/{s.sessions}",
            reward,
            str(s.turns_spanning_push),
            f"{s.rollout_s:.1f}",
            pushed,
            "-" if loss is None else f"{loss:+.4f}",
        )
    return table


def reward_line(stats: list[IterationStats]) -> str:
    """``mean reward per iteration: 0.41 0.47 0.55 ...`` (plain numbers for logs and docs)."""
    values = ["-" if s.mean_reward is None else f"{s.mean_reward:.3f}" for s in stats]
    return "mean reward per iteration: " + " ".join(values)


def write_plot(
    stats: list[IterationStats],
    path: Path,
    *,
    title: str,
    evals: Sequence[EvalRound] = (),
    eval_name: str = "eval",
) -> Path:
    """Mean reward per iteration (with its standard error) as a PNG, drawn with matplotlib's Agg.

    With ``evals``, the eval rounds' mean reward per policy version is a second curve (iteration
    ``k`` rolls out with policy version ``k`` in sync mode, so both share the x axis).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [s for s in stats if s.mean_reward is not None]
    xs = [s.iteration for s in points]
    ys = [s.mean_reward or 0.0 for s in points]
    errs = [s.reward_stderr or 0.0 for s in points]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, color="#2b6cb0", label="rollout (trained on)")
    for x, y in zip(xs, ys, strict=True):
        ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    done = [r for r in evals if r.complete and r.mean_reward is not None]
    if done:
        ex = [r.version for r in done]
        ey = [r.mean_reward or 0.0 for r in done]
        ax.errorbar(
            ex,
            ey,
            yerr=[r.reward_stderr for r in done],
            marker="s",
            capsize=3,
            color="#c05621",
            linestyle="--",
            label=f"{eval_name} (never trained)",
        )
        for x, y in zip(ex, ey, strict=True):
            ax.annotate(
                f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, -13), ha="center", fontsize=8
            )
        xs = sorted(set(xs) | set(ex))
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("iteration / policy version (rollout k samples with version k in sync mode)")
    ax.set_ylabel("mean reward")
    ax.set_title(title, fontsize=10)
    ax.set_xticks(xs)
    ax.set_ylim(0.0, 1.05)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
