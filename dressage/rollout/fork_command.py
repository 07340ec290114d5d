"""``dressage-worker fork``'s process: a fork's branches played with a worker's engine, proxy and agent.

Apart from :mod:`dressage.rollout.fork` (which the rollout worker's tree rollouts use) because it
needs the worker's :func:`~dressage.rollout.worker.serve_episodes`: the worker imports the fork
module, never the other way round.
"""

from __future__ import annotations

from rich.console import Console

from dressage.config import Settings
from dressage.rollout.fork import ForkReport, ForkSpec, plan_fork, run_branches
from dressage.rollout.worker import serve_episodes
from dressage.store import EventStore


async def fork_session(settings: Settings, spec: ForkSpec, console: Console | None = None) -> ForkReport:
    """Run a fork's branches to their end (see the module docstring); ``concurrency`` of the parent
    run's ``worker`` section at once."""
    console = console or Console(stderr=True)
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
            return await run_branches(env, plan)
    finally:
        store.close()
