"""The rollout worker: the loop behind ``dressage-worker rollout``.

One worker process: opens the log, resolves the config (a new run from ``run.yaml``, or the frozen
snapshot of ``--resume RUN``), starts the inference engine (the CPU dev engine as a child process,
or existing SGLang URLs), runs the TITO proxy in-process (or, with ``proxy.urls``, uses standalone
proxies on the same database: :mod:`dressage.rollout.proxy_ring`), creates or continues the run, enqueues
tasks x ``n_samples_per_prompt`` (idempotent), then claims (task, sample) pairs under leases and runs
up to ``concurrency`` episodes at once (:mod:`dressage.rollout.episode`) until the queue is empty.
With an ``eval:`` section it also enqueues the eval round of each new policy version it sees
(:mod:`dressage.rollout.evaluation`); eval tasks are claimed first.

Workers on many machines share one database: claims are exclusive, a crashed worker's leases expire
and the worker that reclaims one continues its running session (``worker.resume_in_flight``, the
default: its recorded turns are replayed, see :mod:`dressage.proxy.replay`) or, with it off, marks
the session ``abandoned`` and starts the (task, sample) again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console
from rich.markup import escape

from dressage.agents import BlackboxAgent, Task, build_agent
from dressage.cleanup import logged_failures
from dressage.config import Settings
from dressage.errors import ConfigError, DressageError, NotSupportedError
from dressage.interrupts import StopFlag
from dressage.paddock import SOCKET_PROVIDERS, SandboxProvider, get_provider, serve_unix_socket_forwarder
from dressage.paddock.limits import LimitsInForce
from dressage.proxy.contract import Proxy, ProxyFactory, ServedProxy
from dressage.redact import redact
from dressage.rollout import task_kinds
from dressage.rollout.branching import run_tree
from dressage.rollout.config import RolloutConfig, load_config, parse_config
from dressage.rollout.datasets import (
    check_reward_fits,
    dataset_digest,
    load_tasks,
    task_specs,
)
from dressage.rollout.engine_health import EngineSupervisor, supervise
from dressage.rollout.engine_process import DevEngineProcess
from dressage.rollout.episode import EpisodeEnv, Outcome, run_episode
from dressage.rollout.evaluation import EvalScheduler, eval_line, read_eval_rounds
from dressage.rollout.lease_wait import describe_lease_wait
from dressage.rollout.progress import RolloutProgress, Snapshot
from dressage.rollout.proxy_ring import ProxyRing, host_port
from dressage.rollout.rewards import build_scorer
from dressage.rollout.secrets import RunSecrets, resolve_secrets
from dressage.rollout.stop_requests import StopRequestWatch
from dressage.store import EventStore, Run, TaskLease

log = logging.getLogger(__name__)


@dataclass
class WorkerOptions:
    """Command-line choices of one worker process."""

    config_path: str | None = None
    resume: str | None = None
    concurrency: int | None = None
    worker_id: str | None = None
    show_progress: bool = True
    proxy_urls: list[str] | None = None
    """Overrides ``proxy.urls`` (the proxies a ``--ray`` rollout placed: :mod:`dressage.cluster`)."""
    session_info: dict[str, Any] | None = None
    """Joins every session's ``info`` (a Ray worker's node id and address)."""
    print_summary: bool = False
    """Print the end-of-run table even without ``show_progress`` (``rollout --no-progress``)."""
    retry_failed: bool = False
    """With ``resume``: also retry pairs whose sessions failed on the agent's side (``--retry-failed``);
    pairs that failed on infrastructure are retried either way."""


@dataclass
class RolloutReport:
    """What a worker did, for the CLI's summary."""

    run: str
    outcomes: dict[str, int] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    example_session: str | None = None
    last_error: str | None = None
    """The last line of the last failed session's error (what ``rollout`` reports when none finished)."""
    interrupted: str | None = None
    """Why the worker stopped before the queue was empty (a signal, a stop request); None when it ran out."""

    def all_failed(self) -> bool:
        """Whether this worker played sessions and not one of them finished."""
        failed = self.outcomes.get("failed", 0) + self.outcomes.get("error", 0)
        return failed > 0 and not self.outcomes.get("finished")


def default_worker_id() -> str:
    """``<hostname>-<pid>``: unique per process, readable in lease owners."""
    return f"{socket.gethostname()}-{os.getpid()}"


def resolve_config(store: EventStore, opts: WorkerOptions) -> tuple[RolloutConfig, dict[str, object] | None]:
    """The config to run and, for a resumed run, its stored snapshot.

    ``--resume RUN`` alone uses the run's frozen snapshot; with ``--config`` too, the file must
    describe the same run (only ``worker.concurrency`` may differ).
    """
    if opts.resume is None:
        if opts.config_path is None:
            raise ConfigError("give --config run.yaml (a new or shared run) or --resume RUN")
        return load_config(opts.config_path), None
    run = store.runs.get(opts.resume)
    stored = run.config.get("rollout")
    if not isinstance(stored, dict):
        raise ConfigError(
            f"run {run.name!r} was not created by `dressage-worker rollout`; it has no rollout config"
        )
    cfg = parse_config(stored, source=f"run {run.name!r} snapshot")
    if opts.config_path is not None:
        given = load_config(opts.config_path)
        if given.run != run.name:
            raise ConfigError(f"--resume {run.name!r} but {opts.config_path} names run {given.run!r}")
        diff = sorted(k for k, v in given.snapshot().items() if stored.get(k) != v)
        if diff:
            raise ConfigError(
                f"{opts.config_path} differs from the frozen config of run {run.name!r} in: {', '.join(diff)}; "
                "resume without --config or start a new run"
            )
        proxy = cfg.proxy.model_copy(update={"urls": given.proxy.urls})
        cfg = cfg.model_copy(update={"worker": given.worker, "proxy": proxy})
    return cfg, run.config


@dataclass
class NewRun:
    """A new run's validated config and tasks, loaded before anything is created."""

    cfg: RolloutConfig
    tasks: list[Task]


def load_new_run(config_path: str) -> NewRun:
    """Load and check everything a new run needs (config, agent, reward, every dataset row).

    Raises :class:`ConfigError` (or the agent's/reward's own error) before the log is touched.
    """
    return checked_run(load_config(config_path))


def checked_run(cfg: RolloutConfig) -> NewRun:
    """``cfg`` with its tasks, once its agent and reward build and every dataset row fits them."""
    build_agent(cfg.agent)
    build_scorer(cfg.reward)
    tasks = load_tasks(cfg.dataset.path, cfg.dataset.limit, cfg.sandbox.provider, cfg.dataset.loader)
    check_reward_fits(
        tasks,
        cfg.reward.kind,
        cfg.agent.kind,
        cfg.sandbox.provider,
        cfg.sandbox.e2b.templates,
        cfg.sandbox.image,
    )
    return NewRun(cfg, tasks)


def _proxy_class() -> ProxyFactory:
    """The proxy a worker serves itself: :class:`~dressage.proxy.server.ProxyServer`."""
    try:
        from dressage.proxy.server import ProxyServer
    except ImportError as e:
        raise NotSupportedError(f"the TITO proxy (dressage.proxy.server) is not available: {e}") from e
    return ProxyServer


async def start_engine_and_proxy(
    store: EventStore,
    cfg: RolloutConfig,
    settings: Settings,
    console: Console,
    proxy_class: ProxyFactory | None = None,
) -> tuple[DevEngineProcess | None, ServedProxy, list[str]]:
    """Start the inference engine and the TITO proxy in front of it; return ``(engine, proxy, urls)``.

    ``engine`` is the CPU dev engine child process for ``engine.kind: dev`` (None for existing
    SGLang URLs); the proxy listens on ``cfg.proxy.host`` on a free port. ``proxy_class`` defaults
    to :class:`dressage.proxy.server.ProxyServer`. If anything fails, what was started is stopped
    (proxy first, then engine) before the error propagates.
    """
    engine: DevEngineProcess | None = None
    proxy: ServedProxy | None = None
    try:
        if cfg.engine.kind == "dev":
            engine = DevEngineProcess(cfg.engine.model, cfg.engine.seed, cfg.engine.threads)
            with console.status(f"starting the dev engine (model {cfg.engine.model}) on {engine.url}"):
                urls = [await engine.start()]
        else:
            urls = list(cfg.engine.urls)
        proxy = (proxy_class or _proxy_class())(
            store,
            urls,
            settings=settings,
            profile=cfg.model_profile,
            host=cfg.proxy.host,
            port=0,
            record_experts=cfg.proxy.record_experts,
            context_window=cfg.proxy.context_window,
            default_sampling=cfg.sampling.engine_defaults(),
        )
        await proxy.start()
    except BaseException:
        if proxy is not None:
            with logged_failures(log, "stopping the proxy"):
                await proxy.stop()
        if engine is not None:
            engine.stop()
        raise
    return engine, proxy, urls


async def run_rollout(
    settings: Settings, opts: WorkerOptions, console: Console | None = None, stop: StopFlag | None = None
) -> RolloutReport:
    """Run a worker until the run's queue is empty, or until ``stop`` is set (by a signal the command
    handles, or by a stop request in the run's log, which this worker watches); see the module
    docstring."""
    console = console or Console(stderr=True)
    if opts.concurrency is not None and opts.concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {opts.concurrency}")
    # A new run's config and dataset are checked whole before the log is opened: a mistake creates nothing.
    fresh = load_new_run(opts.config_path) if opts.resume is None and opts.config_path else None
    store = EventStore.open(settings=settings)
    try:
        cfg, stored = (fresh.cfg, None) if fresh is not None else resolve_config(store, opts)
        if opts.concurrency is not None:
            cfg = cfg.model_copy(
                update={"worker": cfg.worker.model_copy(update={"concurrency": opts.concurrency})}
            )
        if opts.proxy_urls:
            cfg = cfg.model_copy(update={"proxy": cfg.proxy.model_copy(update={"urls": opts.proxy_urls})})
        tasks = fresh.tasks if fresh is not None else None

        def snapshot_of(secrets: RunSecrets, limits: LimitsInForce) -> dict[str, object] | None:
            return stored if tasks is None else run_snapshot(cfg, tasks, secrets, limits)

        async with serve_episodes(store, cfg, settings, console, snapshot_of) as env:
            if tasks is not None and sum(store.tasks.counts(env.run).values()) == 0:
                store.tasks.enqueue(env.run, task_specs(tasks), n_samples=cfg.n_samples_per_prompt)
            env.session_info = dict(opts.session_info or {})
            if opts.resume is not None:
                requeue_failed_pairs(store, env.run, console, agent_failures=opts.retry_failed)
            owner = opts.worker_id or default_worker_id()
            report = RolloutReport(run=env.run.name)
            progress = RolloutProgress(store, env.run, console=console, enabled=opts.show_progress)
            evals = (
                EvalScheduler(store, env.run, cfg.eval, provider=cfg.sandbox.provider)
                if cfg.eval is not None
                else None
            )
            stop = stop or StopFlag()
            watch = StopRequestWatch(store, env.run, stop).attach()
            try:
                async with progress:
                    await _lease_loop(env, owner, report, console, evals, stop)
            finally:
                watch.detach()
            summary = opts.show_progress or opts.print_summary
            await _finish_report(report, progress, env, console if summary else None)
            return report
    finally:
        store.close()


@contextlib.asynccontextmanager
async def serve_episodes(
    store: EventStore,
    cfg: RolloutConfig,
    settings: Settings,
    console: Console,
    snapshot_of: Callable[[RunSecrets, LimitsInForce], Mapping[str, object] | None],
    run_name: str | None = None,
) -> AsyncIterator[EpisodeEnv]:
    """What episodes of ``cfg`` run with: its secrets, agent, reward, sandboxes, the engine and the
    proxy (started here, or the standalone proxies of ``proxy.urls``), the run (``run_name``, by
    default ``cfg.run``, created with ``snapshot_of(secrets, limits)``) and the socket a blackbox agent's
    sandbox reaches the proxy through; all of it stopped on exit. Used by ``rollout`` and ``fork``.

    Before anything starts, the sandbox provider says which mechanism enforces the sandbox limits
    here (one line printed) or refuses (:mod:`dressage.paddock.limits`); a run whose snapshot
    records another mechanism is refused too."""
    engine: DevEngineProcess | None = None
    proxy: Proxy | None = None
    engines: EngineSupervisor | None = None
    forwarder: asyncio.Server | None = None
    socket_dir: str | None = None
    try:
        secrets = resolve_secrets(cfg.secrets)
        store.db.secrets = (*store.db.secrets, *secrets.values())
        settings = with_secrets(settings, secrets)
        agent = build_agent(cfg.agent)
        scorer = build_scorer(cfg.reward)
        provider = sandbox_provider(cfg)
        limits = await sandbox_limits(provider, cfg, console)
        await remove_orphans(provider, console)
        snapshot = snapshot_of(secrets, limits)
        check_recorded_limits(snapshot, limits, run_name or cfg.run)
        if cfg.proxy.urls:
            proxy = remote_proxies(store, cfg, settings)
        else:
            engine, proxy, _urls = await start_engine_and_proxy(store, cfg, settings, console)
            engines = supervise(
                proxy,
                engine,
                max_restarts=cfg.worker.engine_restarts,
                probe_s=cfg.worker.engine_probe_s,
                notify=lambda line: console.print(
                    f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True
                ),
            )
        run: Run = await proxy.create_run(
            run_name or cfg.run, dict(snapshot) if snapshot is not None else None
        )
        proxy_socket = None
        sandbox_url = cfg.proxy.public_url or proxy.base_url
        if isinstance(agent, BlackboxAgent) and via_proxy_socket(cfg):
            socket_dir = tempfile.mkdtemp(prefix="dressage-proxy-")
            sandbox_url = f"http://127.0.0.1:{cfg.sandbox.proxy_port}"
            if (
                not cfg.proxy.urls
            ):  # one socket to this worker's proxy (several: one per session, on the ring)
                proxy_socket = str(Path(socket_dir) / "proxy.sock")
                host, port = host_port(proxy.base_url)
                forwarder = await serve_unix_socket_forwarder(
                    proxy_socket, host, port, connect_timeout=settings.proxy_connect_timeout_s
                )
        env = EpisodeEnv(store, proxy, run, cfg, agent, scorer, provider, proxy_socket, sandbox_url, secrets)
        if cfg.proxy.urls and socket_dir is not None:
            env.session_socket_dir = socket_dir
        env.engines = engines
        yield env
    finally:
        if engines is not None:
            await engines.stop()
        if forwarder is not None:
            forwarder.close()
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
        if proxy is not None:
            with logged_failures(log, "stopping the proxy"):
                await proxy.stop()
        if engine is not None:
            engine.stop()


def run_snapshot(
    cfg: RolloutConfig, tasks: list[Task], secrets: RunSecrets, limits: LimitsInForce | None = None
) -> dict[str, object]:
    """A new run's frozen config: the rollout snapshot, the dataset digest, the task kinds' records,
    the digests of declared secrets (never their values) and, given ``limits``, the mechanism that
    enforces the sandbox limits (``sandbox_limits``)."""
    snapshot: dict[str, object] = {
        "rollout": cfg.snapshot(),
        "dataset_sha256": dataset_digest(tasks),
        **task_kinds.snapshot(tasks),
    }
    if secrets.values():
        snapshot["secret_digests"] = secrets.digests()
    if limits is not None:
        snapshot["sandbox_limits"] = limits.mechanism
    return snapshot


def via_proxy_socket(cfg: RolloutConfig) -> bool:
    """Whether the run's sandboxes reach the proxy through a Unix socket (no network; bwrap, image or docker)."""
    return cfg.sandbox.provider in SOCKET_PROVIDERS and not cfg.sandbox.network


def sandbox_provider(cfg: RolloutConfig) -> SandboxProvider:
    """The provider of ``cfg.sandbox`` (rooted at its ``root_dir`` when one is set)."""
    kwargs: dict[str, object] = {"root_dir": cfg.sandbox.root_dir} if cfg.sandbox.root_dir else {}
    if cfg.sandbox.provider == "docker":
        kwargs["run"] = cfg.run  # the containers' label
    return get_provider(cfg.sandbox.provider, **kwargs)


async def sandbox_limits(provider: SandboxProvider, cfg: RolloutConfig, console: Console) -> LimitsInForce:
    """What enforces the sandbox limits of ``cfg`` here, printed on one line; refused (raised) when
    no mechanism ``sandbox.limits`` accepts can (:meth:`SandboxProvider.limits_in_force`)."""
    limits = await provider.limits_in_force(cfg.sandbox.spec({}, None))
    console.print(limits.line(), markup=False, highlight=False, soft_wrap=True)
    return limits


async def remove_orphans(provider: SandboxProvider, console: Console) -> None:
    """Remove what sandboxes of workers killed before their cleanup left here (docker: containers),
    saying how many; a failure is logged, not raised (:meth:`SandboxProvider.remove_orphans`)."""
    with logged_failures(log, "removing orphaned sandboxes"):
        removed = await provider.remove_orphans()
        if removed:
            console.print(
                f"removed {len(removed)} orphaned {provider.name} sandbox(es) of workers that are gone"
            )


def check_recorded_limits(snapshot: Mapping[str, object] | None, limits: LimitsInForce, run: str) -> None:
    """Refuse to play sessions of a run whose snapshot records another limits mechanism than ours."""
    recorded = (snapshot or {}).get("sandbox_limits")
    if recorded is not None and recorded != limits.mechanism:
        raise ConfigError(
            f"run {run!r} records sandbox limits enforced by {recorded}, but this worker can only use "
            f"{limits.mechanism} ({limits.detail}): run it where {recorded} is available"
        )


async def _finish_report(
    report: RolloutReport, progress: RolloutProgress, env: EpisodeEnv, console: Console | None
) -> None:
    """The run's final counts and an example session in ``report``; the summary table on ``console``."""
    store, run = env.store, env.run
    report.snapshot = await progress.refresh()
    report.example_session = await asyncio.to_thread(example_training_session, store, run)
    if console is not None:
        extra = {"this worker": _fmt_outcomes(report.outcomes), **await eval_summary_row(store, run)}
        console.print(progress.summary_table(report.snapshot, extra))


def example_training_session(store: EventStore, run: Run) -> str | None:
    """The first finished session of a training task (what the closing hint shows; an eval
    session is never trained, so its token view says little about the run), else None."""
    for s in store.sessions.list(run, status="finished"):
        if s.task_id is None or store.tasks.kind_of(s.task_id)[0] != "eval":
            return s.id
    return None


async def eval_summary_row(store: EventStore, run: Run) -> dict[str, str]:
    """The summary table's eval row (``NAME (eval)``: reward per policy version) of a run whose
    config has an ``eval:`` section; empty otherwise."""
    rollout = run.config.get("rollout")
    eval_cfg = rollout.get("eval") if isinstance(rollout, dict) else None
    if not isinstance(eval_cfg, dict):
        return {}
    rounds = await asyncio.to_thread(read_eval_rounds, store, run)
    return {f"{eval_cfg.get('name') or 'eval'} (eval)": eval_line(rounds).split(": ", 1)[1]}


def requeue_failed_pairs(store: EventStore, run: Run, console: Console, *, agent_failures: bool) -> None:
    """``--resume``: put the run's failed pairs back in the queue (agent failures with ``--retry-failed``)."""
    done = store.tasks.requeue_failed(run, agent_failures=agent_failures)
    if done.infrastructure:
        console.print(f"retrying {done.infrastructure} pairs that failed on infrastructure", highlight=False)
    if done.agent:
        console.print(f"retrying {done.agent} pairs whose agent failed (--retry-failed)", highlight=False)
    if done.agent_left:
        console.print(
            f"{done.agent_left} pairs whose agent failed stay failed (retry them with --retry-failed)",
            highlight=False,
        )


def remote_proxies(store: EventStore, cfg: RolloutConfig, settings: Settings) -> ProxyRing:
    """The standalone proxies of ``proxy.urls`` (no engine or proxy of this worker's own)."""
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    return ProxyRing(cfg.proxy.urls, admin, store, connect_timeout=settings.proxy_connect_timeout_s)


def with_secrets(settings: Settings, secrets: RunSecrets) -> Settings:
    """``settings`` whose redaction list also holds the run's declared secret values."""
    if not secrets.values():
        return settings
    extra = [SecretStr(v) for v in secrets.values()]
    return settings.model_copy(update={"secrets": [*settings.secrets, *extra]})


def _fmt_outcomes(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "nothing"


def engines_up(env: EpisodeEnv) -> bool:
    """Whether an engine is up to take new sessions (always, without supervision)."""
    return env.engines is None or env.engines.available


async def raise_if_engines_lost(env: EpisodeEnv) -> None:
    """Raise :class:`EnginesLostError` once no engine is left (and the episodes have ended)."""
    if env.engines is not None and env.engines.lost.is_set():
        counts = await asyncio.to_thread(env.store.tasks.counts, env.run)
        raise env.engines.lost_error(env.run.name, counts["pending"] + counts["leased"])


async def _lease_loop(
    env: EpisodeEnv,
    owner: str,
    report: RolloutReport,
    console: Console,
    evals: EvalScheduler | None = None,
    stop: StopFlag | None = None,
) -> None:
    """Claim and run episodes until no task is pending or leased, or until ``stop`` is set.

    With ``evals``, every pass first enqueues the eval round of a newly recorded policy version.
    On ``stop`` (SIGINT, SIGTERM, a stop request in the log: :mod:`dressage.interrupts`) nothing more
    is claimed, the episodes in flight are cancelled (their sessions stay ``running``) and their
    leases handed back, so ``--resume`` takes those sessions over at once; ``report.interrupted``
    says why.
    """
    store, run, w = env.store, env.run, env.cfg.worker
    stop = stop or StopFlag()
    active: dict[asyncio.Task[Outcome], TaskLease] = {}
    announced = ""  # the lease wait last printed (printed again only when it changes)
    try:
        while not await _stopped(stop):
            if evals is not None:
                await asyncio.to_thread(evals.tick)
            free = w.concurrency - len(active) if engines_up(env) else 0
            claimed = []
            if free > 0:
                claimed = await asyncio.to_thread(
                    store.tasks.claim,
                    run,
                    owner,
                    n=free,
                    lease_s=w.lease_s,
                    max_attempts=w.max_attempts,
                    resume=w.resume_in_flight,
                )
                for lease in claimed:
                    tree = env.cfg.branching is not None and lease.kind == "train"
                    task = asyncio.create_task(run_tree(env, lease) if tree else run_episode(env, lease))
                    active[task] = lease
            if not active:
                counts = await asyncio.to_thread(store.tasks.counts, run)
                if counts["pending"] == 0 and counts["leased"] == 0:
                    return
                await raise_if_engines_lost(env)
                waiting = await asyncio.to_thread(describe_lease_wait, store, run, owner)
                if waiting is not None and waiting.split(" (in ")[0] != announced:
                    announced = waiting.split(" (in ")[0]
                    console.print(waiting, markup=False, highlight=False, soft_wrap=True)
                # other workers hold leases: wait for them or their expiry
                await _sleep_unless(stop, w.poll_s)
                continue
            done, _ = await asyncio.wait(active, timeout=w.poll_s, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                active.pop(task)
                try:
                    out = task.result()
                except DressageError as e:  # e.g. the proxy could not open a session; the lease will expire
                    out = Outcome("error", error=redact(str(e), store.db.secrets))
                report.outcomes[out.status] = report.outcomes.get(out.status, 0) + 1
                if out.status == "interrupted":
                    console.print(
                        f"[yellow]interrupted[/] (an engine died; the pair goes back to the queue): {escape(out.error or '')}",
                        highlight=False,
                    )
                if out.status in ("failed", "error"):
                    lines = (out.error or "").strip().splitlines()
                    report.last_error = lines[-1] if lines else report.last_error
                    console.print(f"[yellow]{out.status}[/]: {escape(out.error or '')}", highlight=False)
    finally:
        for task in active:
            task.cancel()
        if active:
            await asyncio.wait(active, timeout=10)
        if stop.is_set():
            report.interrupted = stop.reason
            await _hand_back(store, list(active.values()))


async def _stopped(stop: StopFlag) -> bool:
    """Whether a stop was asked for; its sources (a log watch: blocking reads) polled in a thread."""
    return stop.is_set() or (bool(stop.sources) and await asyncio.to_thread(stop.poll))


async def _sleep_unless(stop: StopFlag, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def _hand_back(store: EventStore, leases: list[TaskLease]) -> None:
    """Hand back the leases of interrupted episodes: their pairs are claimable at once (logged on failure)."""
    for lease in leases:
        with logged_failures(log, f"handing back the lease of task {lease.task_id}"):
            await asyncio.to_thread(store.tasks.hand_back, lease)
