"""The Ray actors of a ``--ray`` rollout: the dev engine, one proxy per engine, the rollout workers.

Imported only by :mod:`dressage.cluster.ray_rollout` (and so only when Ray is installed and asked
for), which makes them actor classes with ``ray.remote``. Each actor is a thin shell around the component a single-machine rollout already uses:

* :class:`EngineActor` runs :class:`~dressage.rollout.engine_process.DevEngineProcess` (``engine.kind: dev``);
* :class:`ProxyActor` runs a :class:`~dressage.proxy.server.ProxyServer` bound to its node's address;
* :class:`RolloutWorkerActor` runs :func:`~dressage.rollout.worker.run_rollout` (the same lease loop,
  in-flight resume included) on the run, through the proxies (``proxy.urls``), with its node's id
  and address in every session's ``info`` (``ray_node_id``, ``ray_node_ip``, ``worker``).

Actors get only what their environment cannot give them: the database URL the driver was given, the
artifact location, and the proxies' admin token (generated per ``--ray`` rollout; Ray keeps actor
arguments in the GCS's memory). Secrets a run declares come from each node's own environment.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from pydantic import SecretStr

from dressage.config import Settings, load_settings
from dressage.proxy.contract import ServedProxy


@dataclass(frozen=True)
class ActorSettings:
    """The settings the driver hands to its actors (everything else comes from each node's environment)."""

    database_url: str
    home: str
    artifacts_uri: str | None
    admin_token: str

    def settings(self) -> Settings:
        """These values over the node's own environment."""
        return load_settings(
            database_url=self.database_url,
            home=Path(self.home),
            artifacts_uri=self.artifacts_uri,
            admin_token=SecretStr(self.admin_token),
        )


@dataclass
class WorkerResult:
    """What one worker actor's pass over the queue did, for the driver's summary."""

    worker_id: str
    node_id: str
    node_ip: str
    outcomes: dict[str, int] = field(default_factory=dict)


def here() -> tuple[str, str]:
    """``(node id, node address)`` of the calling actor."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


class EngineActor:
    """The CPU dev engine as a child process of this actor; its URL is on this node's loopback."""

    def __init__(self, model: str, seed: int, threads: int) -> None:
        from dressage.rollout.engine_process import DevEngineProcess

        self.engine = DevEngineProcess(model, seed, threads)

    async def start(self) -> tuple[str, str]:
        """Start the engine; return ``(url, node id)``."""
        url = await self.engine.start()
        return url, here()[0]

    def stop(self) -> None:
        """Stop the engine process."""
        self.engine.stop()


class ProxyActor:
    """A TITO proxy in front of one engine, listening on this node's address on a free port."""

    def __init__(self, settings: ActorSettings, engine_url: str, options: dict[str, Any]) -> None:
        self.actor_settings, self.engine_url, self.options = settings, engine_url, options
        self.server: ServedProxy | None = None
        self.store: Any = None

    async def start(self) -> str:
        """Open the log, start the proxy; return its base URL (idempotent)."""
        if self.server is not None:
            return str(self.server.base_url)
        from dressage.proxy.server import ProxyServer
        from dressage.store import EventStore

        settings = self.actor_settings.settings()
        self.store = EventStore.open(settings=settings)
        self.server = ProxyServer(
            self.store, [self.engine_url], settings=settings, host=here()[1], port=0, **self.options
        )
        await self.server.start()
        return str(self.server.base_url)

    async def stop(self) -> None:
        """Stop serving and close the log."""
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.store is not None:
            self.store.close()
            self.store = None


class RolloutWorkerActor:
    """One rollout worker: :func:`~dressage.rollout.worker.run_rollout` on the run until its queue is empty."""

    def __init__(self, settings: ActorSettings, index: int) -> None:
        self.actor_settings, self.index = settings, index

    def run(self, run: str, proxy_urls: list[str], concurrency: int | None) -> WorkerResult:
        """One pass: claim and play (task, sample) pairs until none is pending or leased.

        A restarted actor (after a crash or a lost node) runs this again under a new worker id; the
        leases its previous incarnation held expire and are taken over (in-flight resume).
        """
        from rich.console import Console

        from dressage.harbor.kind import register
        from dressage.rollout.worker import WorkerOptions, run_rollout

        register()  # an actor's process is its own top: the built-in task kinds

        node_id, node_ip = here()
        worker_id = f"ray-{node_ip}-{node_id[:8]}-{self.index}-{os.getpid()}"
        opts = WorkerOptions(
            resume=run,
            concurrency=concurrency,
            worker_id=worker_id,
            show_progress=False,
            proxy_urls=list(proxy_urls),
            session_info={"ray_node_id": node_id, "ray_node_ip": node_ip, "worker": worker_id},
        )
        console = Console(stderr=True, quiet=True)
        report = asyncio.run(run_rollout(self.actor_settings.settings(), opts, console))
        return WorkerResult(worker_id, node_id, node_ip, dict(report.outcomes))
