"""Live display of the RL loop: a bar per iteration's rollout, a spinner while the trainer works.

The rollout bar counts the iteration's finished (task, sample) pairs from the log's task queue,
polled twice a second; the line printed when an iteration ends carries its mean reward. A display
is never why an iteration fails: a poll the log cannot answer (a :class:`StoreError`) is logged
once and the bar keeps its last count until a later poll succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from dressage.errors import StoreError
from dressage.loop.report import IterationStats
from dressage.store import EventStore, Run

log = logging.getLogger(__name__)


class LoopProgress:
    """Rich progress for ``dressage-worker loop`` (on stderr; a no-op when disabled)."""

    def __init__(self, console: Console, iterations: int, *, enabled: bool = True) -> None:
        self.console = console
        self.iterations = iterations
        self.enabled = enabled
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.store: EventStore | None = None
        self.run: Run | None = None

    def __enter__(self) -> LoopProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def attach(self, store: EventStore, run: Run) -> None:
        """Where the rollout bars read their counts."""
        self.store, self.run = store, run

    @contextlib.asynccontextmanager
    async def rollout(self, k: int, total: int, already_done: int) -> AsyncIterator[None]:
        """A bar for iteration ``k``'s ``total`` pairs; ``already_done`` pairs belong to earlier ones."""
        bar = self._progress.add_task(f"rollout {k + 1}/{self.iterations}", total=total)

        async def poll() -> None:
            failing = False
            while self.store is not None and self.run is not None:
                try:
                    counts = await asyncio.to_thread(self.store.tasks.counts, self.run, kind="train")
                except StoreError as e:
                    if not failing:  # once per outage, not twice a second
                        log.warning("progress display: could not read the log (%s); the loop goes on", e)
                    failing = True
                else:
                    failing = False
                    done = counts.get("done", 0) + counts.get("failed", 0) - already_done
                    self._progress.update(bar, completed=max(0, min(total, done)))
                await asyncio.sleep(0.5)

        poller = asyncio.create_task(poll())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            self._progress.update(bar, completed=total)
            self._progress.remove_task(bar)

    @contextlib.contextmanager
    def training(self, k: int) -> Iterator[None]:
        """A spinner while iteration ``k``'s steps train and the new weights are pushed."""
        bar = self._progress.add_task(f"train on iteration {k + 1}, push weights", total=None)
        try:
            yield
        finally:
            self._progress.remove_task(bar)

    def iteration_done(self, stats: IterationStats) -> None:
        """One line per finished rollout: sessions, mean reward, token versions."""
        reward = "-" if stats.mean_reward is None else f"{stats.mean_reward:.3f}"
        self._progress.console.print(
            f"iteration {stats.iteration}: {stats.finished}/{stats.sessions} sessions finished, "
            f"mean reward {reward}, policy version {stats.version_label}, {stats.rollout_s:.1f}s",
            highlight=False,
        )
