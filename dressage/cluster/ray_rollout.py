"""``--ray``: connect to a Ray cluster, place the run's actors, drain its queue, print the same summary.

The driver (``dressage-worker rollout --ray ADDRESS``) does what one worker process does before its
lease loop (check the config and dataset, create the run, enqueue its (task, sample) pairs) and
then, instead of playing episodes itself, places actors (:mod:`dressage.cluster.layout` decides
where, :mod:`dressage.cluster.actors` are the actors):

0. before any actor is created, the whole placement is checked against what each node has free
   (:func:`dressage.cluster.layout.service_slots`, :func:`~dressage.cluster.layout.worker_slots`):
   a demand no node can meet is refused in one line instead of an actor waiting for room forever;
1. ``engine.kind: dev``: the dev engine as an actor (``ray.engine`` resources) on the node the
   check chose; SGLang engines are the run's ``engine.urls`` (or slime's,
   :mod:`dressage.integrations.slime`);
2. one proxy actor per engine, pinned to the engine's node (hard affinity to the dev engine's actor,
   soft to the node whose address is an SGLang URL's host); with ``proxy.urls`` the run's own
   standalone proxies are used instead;
3. ``ray.workers_per_node`` rollout worker actors on each node that has their resources, each one
   the unchanged lease loop of :func:`dressage.rollout.worker.run_rollout` over the proxies
   (``proxy.urls``), so leases, takeover and in-flight resume are exactly those of many worker
   processes on one database.

Worker actors are restarted by Ray (``ray.max_restarts``, their pass retried) on their node or,
when it is gone, wherever their resources are. Whatever Ray does, the log's leases keep every
(task, sample) exactly once. The progress bar, the summary table and the exit code are the
single-machine ones; the summary adds how many Ray workers ran on how many nodes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import yaml
from ray._private.state import available_resources_per_node
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console

from dressage.agents import Task
from dressage.cluster.actors import ActorSettings, EngineActor, ProxyActor, RolloutWorkerActor, WorkerResult
from dressage.cluster.layout import NodeInfo, service_slots, worker_slots
from dressage.config import Settings
from dressage.errors import ConfigError, DressageError
from dressage.interrupts import StopFlag
from dressage.rollout.config import RolloutConfig, load_config, parse_config
from dressage.rollout.datasets import (
    task_specs,
)
from dressage.rollout.progress import RolloutProgress
from dressage.rollout.proxy_ring import ProxyRing
from dressage.rollout.ray_config import RayConfig
from dressage.rollout.secrets import resolve_secrets
from dressage.rollout.stop_requests import StopRequestWatch, request_stop
from dressage.rollout.worker import (
    NewRun,
    RolloutReport,
    WorkerOptions,
    checked_run,
    eval_summary_row,
    example_training_session,
    load_new_run,
    resolve_config,
    run_snapshot,
)
from dressage.store import EventStore, Run

log = logging.getLogger(__name__)

ENGINE_ACTOR = ray.remote(EngineActor)
PROXY_ACTOR = ray.remote(ProxyActor)
WORKER_ACTOR = ray.remote(RolloutWorkerActor)

NAMESPACE = "dressage"
"""The Ray namespace of the worker actors, named ``dressage-worker:RUN:K`` (``ray.get_actor(name, NAMESPACE)``)."""


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``, ``HOST:PORT``, or ``local``: start one here).

    Returns True when this call connected (the caller disconnects when done); inside a Ray actor
    (slime's rollout manager) the existing connection is used and False returned.
    """
    if ray.is_initialized():
        return False
    try:
        if address == "local":
            # one machine: loopback, whatever outward address Ray would detect (it may not be routable)
            ray.init(include_dashboard=False, logging_level=logging.WARNING, _node_ip_address="127.0.0.1")
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise DressageError(
            f"cannot connect to the Ray cluster at {address!r}: {e}. Give `--ray auto` (the cluster this "
            "node belongs to), `--ray HOST:PORT` (its GCS address) or `--ray local` (start one here)"
        ) from None
    return True


async def remote_call(ref: Awaitable[object], what: str) -> Any:
    """Await an actor call; its failure becomes a one-line :class:`DressageError` naming ``what``."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as e:
        raise DressageError(f"{what} failed: {type(e.cause).__name__}: {e.cause}") from None
    except ray.exceptions.RayError as e:
        raise DressageError(f"{what} died: {str(e).splitlines()[0]}") from None


def alive_nodes() -> list[NodeInfo]:
    """The cluster's alive nodes, with what each has free now (not held by running actors)."""
    free = available_resources_per_node()  # Ray's DeveloperAPI (its TPU utilities use it too)
    return [NodeInfo.from_ray(n, free.get(n["NodeID"])) for n in ray.nodes() if n.get("Alive")]


def actor_settings(settings: Settings, admin_token: str | None = None) -> ActorSettings:
    """What the driver hands its actors: the log, the artifacts, a proxy admin token."""
    token = admin_token or (settings.admin_token.get_secret_value() if settings.admin_token else None)
    return ActorSettings(
        database_url=settings.resolved_database_url(),
        home=str(settings.home),
        artifacts_uri=settings.artifacts_uri,
        admin_token=token or secrets.token_urlsafe(24),
    )


DRAINED_GRACE_S = 20.0
"""How long the driver waits, once no pair is pending or leased, for the passes still running to
end and report (a pass closes its sandboxes and its log after its last pair)."""
STOP_GRACE_S = 60.0
"""How long an interrupted driver waits for the worker actors to stop (they see the stop request it
wrote in the log at their next claim, and hand back their leases) before it kills them."""


@dataclass
class Placement:
    """The actors of one ``--ray`` rollout: engine, proxies, workers (see the module docstring)."""

    cfg: RolloutConfig
    ray_cfg: RayConfig
    settings: ActorSettings
    console: Console
    engine: Any = None
    proxies: list[Any] = field(default_factory=list)
    proxy_urls: list[str] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)
    worker_nodes: list[NodeInfo] = field(default_factory=list)
    passes: list[Any] = field(default_factory=list)
    free_nodes: list[NodeInfo] | None = None
    """What the nodes have free for workers once this run's engine and proxies are placed."""
    taken: str = ""

    async def start_proxies(self, engine_urls: list[str] | None = None) -> list[str]:
        """The proxies to use: ``proxy.urls``, else one proxy actor per engine (started here).

        The whole placement (engine, proxies, workers) is checked first against what the nodes
        have free: nothing is created when some part cannot be placed (one-line ConfigError).
        """
        if self.cfg.proxy.urls:
            self.proxy_urls = list(self.cfg.proxy.urls)
            worker_slots(alive_nodes(), self.ray_cfg)  # refused now, not by a worker waiting for room
            return self.proxy_urls
        dev = engine_urls is None and self.cfg.engine.kind == "dev"
        urls = None if dev else (engine_urls if engine_urls is not None else list(self.cfg.engine.urls))
        services = service_slots(alive_nodes(), self.ray_cfg, urls)
        worker_slots(services.nodes, self.ray_cfg, services.taken)
        self.free_nodes, self.taken = services.nodes, services.taken
        slots: list[tuple[str, str | None, bool]]  # engine url, node id, hard affinity
        if dev:
            assert services.engine_node is not None
            e = self.cfg.engine
            self.engine = ENGINE_ACTOR.options(
                **self.ray_cfg.engine.ray_options(),
                scheduling_strategy=NodeAffinitySchedulingStrategy(services.engine_node.node_id, soft=False),
            ).remote(e.model, e.seed, e.threads)
            with self.console.status(f"starting the dev engine (model {e.model}) as a Ray actor"):
                url, node_id = await remote_call(self.engine.start.remote(), "the dev engine actor")
            slots = [(url, node_id, True)]
        else:
            slots = [(s.engine_url, s.node.node_id if s.node else None, False) for s in services.proxies]
        options = {
            "profile": self.cfg.model_profile,
            "record_experts": self.cfg.proxy.record_experts,
            "context_window": self.cfg.proxy.context_window,
            "default_sampling": self.cfg.sampling.engine_defaults(),
        }
        for url, node_id, hard in slots:
            strategy = NodeAffinitySchedulingStrategy(node_id, soft=not hard) if node_id else "DEFAULT"
            self.proxies.append(
                PROXY_ACTOR.options(**self.ray_cfg.proxy.ray_options(), scheduling_strategy=strategy).remote(
                    self.settings, url, options
                )
            )
        with self.console.status(f"starting {len(self.proxies)} proxy actor(s)"):
            starts = [remote_call(p.start.remote(), "a proxy actor") for p in self.proxies]
            self.proxy_urls = list(await asyncio.gather(*starts))
        return self.proxy_urls

    def start_workers(self, run: str) -> None:
        """Create the worker actors, spread over the nodes that have their resources free (after
        this run's engine and proxies, when :meth:`start_proxies` placed them)."""
        restarts = self.ray_cfg.max_restarts
        nodes = self.free_nodes if self.free_nodes is not None else alive_nodes()
        for i, slot in enumerate(worker_slots(nodes, self.ray_cfg, self.taken)):
            self.workers.append(
                WORKER_ACTOR.options(
                    name=f"dressage-worker:{run}:{i}",
                    namespace=NAMESPACE,
                    max_restarts=restarts,
                    max_task_retries=-1 if restarts != 0 else 0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node.node_id, soft=True),
                    **self.ray_cfg.worker.ray_options(),
                ).remote(self.settings, i)
            )
            self.worker_nodes.append(slot.node)

    def launch(self, run: Run) -> list[Any]:
        """Start every worker actor's pass over the run's queue (not awaited); returns their refs."""
        self.passes = [
            w.run.remote(run.name, self.proxy_urls, self.cfg.worker.concurrency) for w in self.workers
        ]
        return self.passes

    async def drain(self, store: EventStore, run: Run, stop: StopFlag | None = None) -> list[WorkerResult]:
        """One pass of every worker actor over the run's queue; returns when the queue is drained,
        or once the passes ended after ``stop`` was set (SIGINT, SIGTERM, a stop request).

        That is when every worker's pass has ended, or when no pair has been pending or leased for
        :data:`DRAINED_GRACE_S` while some passes still have not ended (a restarted actor waiting
        for room on a smaller cluster: it has nothing left to do). The grace lets the passes that
        played the last pairs report, so the summary counts every worker that ran. A worker that
        died for good (restarts used up) is reported; if pairs are still pending or leased when all are gone, that is an error saying
        how to continue (``--resume RUN``). On ``stop`` the driver writes a stop request in the log
        (the actors are workers of the run like any other: they stop claiming and hand back their
        leases) and waits up to :data:`STOP_GRACE_S` for their passes.
        """
        if stop is not None and stop.is_set():
            return []  # stopped before any pass started
        refs = dict(zip(self.launch(run), self.worker_nodes, strict=True))
        results: list[WorkerResult] = []
        lost = 0
        pending = list(refs)
        drained_at: float | None = None
        stop_by: float | None = None
        while pending:
            if stop_by is None and stop is not None and await asyncio.to_thread(stop.poll):
                stop_by = time.monotonic() + STOP_GRACE_S
                await asyncio.to_thread(request_stop, store, run, f"the Ray driver stopped ({stop.reason})")
            if stop_by is not None and time.monotonic() > stop_by:
                self.console.print(f"[yellow]{len(pending)} Ray rollout worker(s) had not stopped: killed[/]")
                break
            done, pending = await asyncio.to_thread(ray.wait, pending, num_returns=len(pending), timeout=1.0)
            for ref in done:
                result = await self._result(ref, refs[ref])
                if result is None:
                    lost += 1
                else:
                    results.append(result)
            counts = await asyncio.to_thread(store.tasks.counts, run)
            if pending and stop_by is None and not counts["pending"] and not counts["leased"]:
                # A pass that played the last pair may still be closing: give it time to report.
                if drained_at is None:
                    drained_at = time.monotonic()
                elif time.monotonic() - drained_at > DRAINED_GRACE_S:
                    self.console.print(
                        f"[yellow]{len(pending)} Ray rollout worker(s) had not ended {DRAINED_GRACE_S:.0f} s "
                        "after the queue drained (waiting for room on the cluster): nothing was left for them[/]"
                    )
                    break
        if lost and stop_by is None and (counts["pending"] or counts["leased"]):
            raise DressageError(
                f"{lost} Ray rollout worker(s) died past ray.max_restarts with {counts['pending']} pending and "
                f"{counts['leased']} leased (task, sample) pairs left; continue with `--resume {run.name}`"
            )
        return results

    async def _result(self, ref: Awaitable[WorkerResult], node: NodeInfo) -> WorkerResult | None:
        """A worker's pass, None (reported) when its actor died for good; its own failure raises."""
        try:
            result: WorkerResult = await ref
            return result
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            what = str(cause) if isinstance(cause, DressageError) else f"{type(cause).__name__}: {cause}"
            raise DressageError(f"a Ray rollout worker on {node.ip}: {what}") from None
        except ray.exceptions.RayError as e:
            self.console.print(
                f"[yellow]a Ray rollout worker on {node.ip} died for good: {str(e).splitlines()[0]}[/]"
            )
            return None

    def stop(self) -> None:
        """Kill every actor of the placement (the proxies and the engine last)."""
        for actor in [*self.workers, *self.proxies]:
            ray.kill(actor)
        if self.engine is not None:
            ray.kill(self.engine)
        self.workers, self.proxies, self.engine = [], [], None


def new_run_snapshot(cfg: RolloutConfig, tasks: list[Task]) -> dict[str, object]:
    """A new run's frozen config, as ``dressage-worker rollout`` records it."""
    return run_snapshot(cfg, tasks, resolve_secrets(cfg.secrets))


def load_run_on_engines(config_path: str, engine_urls: list[str]) -> NewRun:
    """A new run's config with ``engine: {kind: sglang, urls: engine_urls}`` (engines someone else
    started: slime's), checked whole as :func:`~dressage.rollout.worker.load_new_run` checks it."""
    path = Path(config_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read the run config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (run, dataset, agent, ...)")
    engine = dict(data.get("engine") or {})
    engine.update(kind="sglang", urls=list(engine_urls))
    for dev_only in ("seed", "threads", "model"):
        engine.pop(dev_only, None)
    cfg = parse_config({**data, "engine": engine}, source=str(path), base_dir=path.parent.resolve())
    return checked_run(cfg)


def _placement_config(
    store: EventStore, opts: WorkerOptions, engine_urls: list[str] | None = None
) -> tuple[RolloutConfig, RayConfig, Any]:
    """The run's config (new or resumed), its ``ray:`` section, and a new run's checked tasks."""
    if opts.resume is None and opts.config_path and engine_urls is not None:
        fresh = load_run_on_engines(opts.config_path, engine_urls)
        cfg = fresh.cfg
        tasks = fresh.tasks
    elif opts.resume is None and opts.config_path:
        fresh = load_new_run(opts.config_path)
        cfg = fresh.cfg
        tasks = fresh.tasks
    else:
        cfg, _stored = resolve_config(store, opts)
        tasks = None
    given = cfg if tasks is not None else (load_config(opts.config_path) if opts.config_path else None)
    ray_cfg = (given.ray if given is not None else None) or RayConfig()
    if opts.concurrency is not None:
        if opts.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {opts.concurrency}")
        cfg = cfg.model_copy(
            update={"worker": cfg.worker.model_copy(update={"concurrency": opts.concurrency})}
        )
    return cfg, ray_cfg, tasks


@dataclass
class PlacedRun:
    """A run whose actors are placed: the placement, the run, and whether this process connected to Ray."""

    placement: Placement
    run: Run
    owned: bool

    def stop(self) -> None:
        """Kill the actors; disconnect when this process connected."""
        self.placement.stop()
        if self.owned:
            ray.shutdown()
            self.owned = False


async def place_run(
    store: EventStore,
    settings: Settings,
    opts: WorkerOptions,
    address: str,
    console: Console,
    engine_urls: list[str] | None = None,
) -> PlacedRun:
    """Check the config, connect, start the proxies, create (or join) the run and enqueue it, and
    create the worker actors (their passes are started by :meth:`Placement.drain`).

    ``engine_urls`` are engines started by someone else (slime's SGLang engines): they replace the
    config's ``engine`` section (``kind: sglang``).
    """
    cfg, ray_cfg, tasks = _placement_config(store, opts, engine_urls)
    owned = await asyncio.to_thread(connect, address)
    placement = Placement(cfg, ray_cfg, actor_settings(settings), console)
    try:
        urls = await placement.start_proxies(engine_urls)
        ring = ProxyRing(
            urls, placement.settings.admin_token, store, connect_timeout=settings.proxy_connect_timeout_s
        )
        snapshot = new_run_snapshot(cfg, tasks) if tasks is not None else store.runs.get(cfg.run).config
        run = await ring.create_run(cfg.run, snapshot)
        if tasks is not None and sum(store.tasks.counts(run).values()) == 0:
            store.tasks.enqueue(run, task_specs(tasks), n_samples=cfg.n_samples_per_prompt)
        placement.start_workers(run.name)
    except BaseException:
        placement.stop()
        if owned:
            ray.shutdown()
        raise
    return PlacedRun(placement, run, owned)


async def run_ray_rollout(
    settings: Settings,
    opts: WorkerOptions,
    address: str,
    console: Console | None = None,
    stop: StopFlag | None = None,
) -> RolloutReport:
    """``dressage-worker rollout --ray ADDRESS``: see the module docstring. On ``stop`` (or a stop
    request in the run's log) the actors stop, the report says ``interrupted``, and the actors are
    killed (proxies and engine last)."""
    console = console or Console(stderr=True)
    if opts.resume is None and opts.config_path is None:
        raise ConfigError("give --config run.yaml (a new or shared run) or --resume RUN")
    store = EventStore.open(settings=settings)
    placed: PlacedRun | None = None
    try:
        placed = await place_run(store, settings, opts, address, console)
        stop = stop or StopFlag()
        watch = StopRequestWatch(store, placed.run, stop).attach()
        progress = RolloutProgress(store, placed.run, console=console, enabled=opts.show_progress)
        try:
            async with progress:
                results = await placed.placement.drain(store, placed.run, stop)
        finally:
            watch.detach()
        report = await _report(store, placed.run, progress, results, opts, console)
        report.interrupted = stop.reason
        return report
    finally:
        if placed is not None:
            placed.stop()
        store.close()


async def _report(
    store: EventStore,
    run: Run,
    progress: RolloutProgress,
    results: list[WorkerResult],
    opts: WorkerOptions,
    console: Console,
) -> RolloutReport:
    """The single-machine summary, plus a line on the Ray workers."""
    report = RolloutReport(run=run.name)
    for r in results:
        for k, v in r.outcomes.items():
            report.outcomes[k] = report.outcomes.get(k, 0) + v
    report.snapshot = await progress.refresh()
    report.example_session = await asyncio.to_thread(example_training_session, store, run)
    if opts.show_progress or opts.print_summary:
        nodes = len({r.node_id for r in results})
        done = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "nothing"
        extra = {f"Ray workers ({len(results)} on {nodes} nodes)": done, **await eval_summary_row(store, run)}
        console.print(progress.summary_table(report.snapshot, extra))
    return report


class RayLoopWorkers:
    """``dressage-worker loop --ray``: each iteration's rollout on Ray worker actors.

    The loop keeps its engine, its proxy (weight pushes pause and continue it) and its trainer in
    its own process; the worker actors (placed as for ``rollout --ray``) play the iteration's
    (task, sample) pairs through that proxy, so ``proxy.host`` must be an address the nodes reach.
    """

    def __init__(self, address: str, cfg: RolloutConfig, settings: Settings, console: Console) -> None:
        self.address, self.cfg, self.settings, self.console = address, cfg, settings, console
        self.placement: Placement | None = None
        self.owned = False

    async def start(self, run: Run, proxy_url: str) -> None:
        """Connect and create the worker actors (they live for the whole loop)."""
        self.owned = await asyncio.to_thread(connect, self.address)
        self.placement = Placement(
            self.cfg, self.cfg.ray or RayConfig(), actor_settings(self.settings), self.console
        )
        self.placement.proxy_urls = [proxy_url]
        self.placement.start_workers(run.name)

    async def drain(self, store: EventStore, run: Run, stop: StopFlag | None = None) -> list[WorkerResult]:
        """Play every pending (task, sample) pair of the run on the worker actors (until ``stop``)."""
        assert self.placement is not None, "start() first"
        return await self.placement.drain(store, run, stop)

    def stop(self) -> None:
        """Kill the actors; disconnect when this loop connected."""
        if self.placement is not None:
            self.placement.stop()
            self.placement = None
        if self.owned:
            ray.shutdown()
            self.owned = False
