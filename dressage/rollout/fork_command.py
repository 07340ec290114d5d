"""``dressage-worker fork``'s process: a fork's branches played with a worker's engine, proxy and agent.

Apart from :mod:`dressage.rollout.fork` (which the rollout worker's tree rollouts use) because it
needs the worker's :func:`~dressage.rollout.worker.serve_episodes`: the worker imports the fork
module, never the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine

from rich.console import Console

from dressage.config import Settings
from dressage.interrupts import StopFlag
from dressage.rollout.fork import ForkPlan, ForkReport, ForkSpec, plan_fork, run_branches
from dressage.rollout.stop_requests import StopRequestWatch
from dressage.rollout.worker import serve_episodes
from dressage.store import EventStore


async def fork_session(
    settings: Settings, spec: ForkSpec, console: Console | None = None, stop: StopFlag | None = None
) -> ForkReport:
    """Run a fork's branches to their end (see the module docstring); ``concurrency`` of the parent
    run's ``worker`` section at once.

    On ``stop`` (a signal the command handles, or a stop request in the branches' run) the branches
    in flight are cancelled: their sessions stay ``running`` for ``fork ... --resume`` to take over,
    and the report says ``interrupted``.
    """
    console = console or Console(stderr=True)
    stop = stop or StopFlag()
    store = EventStore.open(settings=settings)
    try:
        plan = plan_fork(store, spec)
        async with serve_episodes(
            store,
            plan.cfg,
            settings,
            console,
            lambda _secrets, _limits: plan.run_config,
            run_name=plan.run_name,
        ) as env:
            watch = StopRequestWatch(store, env.run, stop).attach()
            try:
                return await _unless_stopped(run_branches(env, plan), stop, plan)
            finally:
                watch.detach()
    finally:
        store.close()


async def _unless_stopped(
    branches: Coroutine[object, object, ForkReport], stop: StopFlag, plan: ForkPlan
) -> ForkReport:
    """The branches' report, or, once ``stop`` is set, an interrupted report after cancelling them."""
    played = asyncio.ensure_future(branches)
    while not played.done():
        await asyncio.wait({played}, timeout=1.0)
        if not played.done() and await asyncio.to_thread(stop.poll):
            played.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await played
            report = ForkReport(plan.run_name, plan.parent.id, plan.spec.fork_turn)
            report.interrupted = stop.reason
            return report
    return played.result()
