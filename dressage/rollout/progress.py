"""Progress of a rollout: a rich progress bar while it runs and a summary table at the end.

Numbers come from the log (task queue and session projections), not from this process, so with
several workers every one of them shows the whole run: (task, sample) pairs done/total, tokens per
second (context + generated tokens recorded per second of wall time), and the mean reward of
finished sessions. A log the display cannot read is logged and the rollout goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dressage.errors import StoreError
from dressage.store import EventStore, Run

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """One reading of the run's counters."""

    done: int
    total: int
    tokens: int
    mean_reward: float | None
    sessions: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    at: float = field(default_factory=time.monotonic)


def read_snapshot(store: EventStore, run: Run) -> Snapshot:
    """Counters of ``run`` from the log."""
    tasks = store.tasks.counts(run)
    summary = store.runs.summary(run)
    return Snapshot(
        done=tasks.get("done", 0) + tasks.get("failed", 0),
        total=sum(tasks.values()),
        tokens=summary.tokens,
        mean_reward=summary.mean_reward,
        sessions=dict(summary.sessions),
        tasks=tasks,
        turns=summary.turns,
    )


class RolloutProgress:
    """Polls the log once a second and renders a progress bar on stderr."""

    def __init__(
        self, store: EventStore, run: Run, *, console: Console | None = None, enabled: bool = True
    ) -> None:
        self.store, self.run = store, run
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.started = time.monotonic()
        self._first: Snapshot | None = None
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("sessions"),
            TextColumn("{task.fields[rate]} tok/s"),
            TextColumn("mean reward {task.fields[reward]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self._bar = self._progress.add_task(run.name, total=None, rate="-", reward="-")
        self._task: asyncio.Task[None] | None = None
        self._display_failing = False

    async def __aenter__(self) -> RolloutProgress:
        self._progress.start()
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._refresh_display()
        self._progress.stop()

    async def _poll(self) -> None:
        while True:
            await self._refresh_display()
            await asyncio.sleep(1.0)

    async def _refresh_display(self) -> None:
        """:meth:`refresh` for the display: a log that cannot answer (a :class:`StoreError`) is
        logged once per outage and the bar keeps its last values; the rollout goes on."""
        try:
            await self.refresh()
        except StoreError as e:
            if not self._display_failing:
                log.warning("progress display: could not read the log (%s); the rollout goes on", e)
            self._display_failing = True
        else:
            self._display_failing = False

    async def refresh(self) -> Snapshot:
        """Read the counters and update the bar."""
        snap = await asyncio.to_thread(read_snapshot, self.store, self.run)
        if self._first is None:
            self._first = snap
        dt = snap.at - self._first.at
        rate = f"{(snap.tokens - self._first.tokens) / dt:,.0f}" if dt > 0.5 else "-"
        reward = f"{snap.mean_reward:.3f}" if snap.mean_reward is not None else "-"
        self._progress.update(
            self._bar, completed=snap.done, total=snap.total or None, rate=rate, reward=reward
        )
        return snap

    def summary_table(self, snap: Snapshot, extra: Mapping[str, object] | None = None) -> Table:
        """The end-of-run table."""
        wall = time.monotonic() - self.started
        table = Table(title=f"rollout {self.run.name}", show_header=False)
        table.add_column("what", style="bold")
        table.add_column("value", justify="right")
        rows: list[tuple[str, str]] = [
            ("(task, sample) pairs", f"{snap.total}"),
            (
                "done / failed / pending / leased",
                "{done} / {failed} / {pending} / {leased}".format(**snap.tasks),
            ),
            ("sessions finished", str(snap.sessions.get("finished", 0))),
            ("failed attempts", str(snap.sessions.get("failed", 0))),
            ("abandoned (crash/lease expiry)", str(snap.sessions.get("abandoned", 0))),
            ("turns", f"{snap.turns:,}"),
            ("tokens", f"{snap.tokens:,}"),
            ("mean reward", f"{snap.mean_reward:.4f}" if snap.mean_reward is not None else "-"),
            ("wall time", f"{wall:.1f} s"),
        ]
        for k, v in (extra or {}).items():
            rows.append((k, str(v)))
        for k, v in rows:
            table.add_row(k, v)
        return table
