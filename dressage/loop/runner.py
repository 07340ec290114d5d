"""The RL loop in one process: rollout at policy version v -> train -> push v+1 -> next rollout.

``dressage-worker loop`` starts the inference engine (the CPU dev engine as a child process, or
existing SGLang URLs) and the TITO proxy once, then runs K iterations. Iteration ``k`` enqueues the
dataset's tasks again as task indexes ``k * n ... k * n + n - 1`` (so group indexes stay unique in
the run), runs them with the rollout worker's lease loop, and the replay trainer (the ``torch``
backend, consumer ``train:loop``) trains on the newly ready groups and pushes the new weights
through the proxy's admin API (pause, ``update_weights_from_disk`` with the new version, record
the version, resume).

* **sync**: rollout ``k`` waits until iteration ``k - 1`` is trained and pushed, so every token of
  iteration ``k`` is sampled by policy ``k`` (with one optimizer step per iteration).
* **async**: rollout ``k`` starts as soon as rollout ``k - 1`` ends, while the trainer trains on
  ``k - 1`` in a thread; the push pauses the proxy with sessions in flight, and their tokens after
  the resume carry the new version. The rollout never runs more than one iteration ahead of the
  trainer, and ``train.max_staleness`` masks tokens older than that.

With an ``eval:`` section, each new policy version's eval round is enqueued by the lease loop
(claimed before training tasks) and the last version's round runs after the last push.

Everything the loop does is in the run's log (tasks, turns with per-token versions,
``policy_version`` events, step manifests with the consumer checkpoint), so
``dressage-worker train --from-run RUN --consumer loop --replay`` re-checks every step.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname

from pydantic import SecretStr
from rich.console import Console

from dressage.agents import BlackboxAgent, build_agent
from dressage.cleanup import logged_failures
from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.interrupts import StopFlag
from dressage.loop.progress import LoopProgress
from dressage.loop.report import IterationStats, read_iteration
from dressage.paddock.limits import LimitsInForce
from dressage.proxy.contract import ServedProxy
from dressage.rollout.config import LoopConfig, RolloutConfig, load_config, parse_config
from dressage.rollout.datasets import check_reward_fits, load_tasks
from dressage.rollout.engine_process import DevEngineProcess
from dressage.rollout.episode import EpisodeEnv
from dressage.rollout.evaluation import EvalRound, EvalScheduler, read_eval_rounds
from dressage.rollout.rewards import build_scorer
from dressage.rollout.secrets import resolve_secrets
from dressage.rollout.stop_requests import StopRequestWatch
from dressage.rollout.worker import (
    RolloutReport,
    _lease_loop,
    default_worker_id,
    load_new_run,
    run_snapshot,
    sandbox_limits,
    sandbox_provider,
    start_engine_and_proxy,
    with_secrets,
)
from dressage.store import EventStore, Run, TaskSpec
from dressage.store.replica import open_replica_store
from dressage.training.config import TrainConfig, TrainerSetup, build_trainer
from dressage.training.consumer import Trainer
from dressage.training.loggers import Loggers, parse_log_to, version_rewards

if TYPE_CHECKING:
    from dressage.training.weight_push import WeightPusher

log = logging.getLogger(__name__)
T = TypeVar("T")

CONSUMER = "loop"


@dataclass
class LoopOptions:
    """Command-line choices of one loop; ``None`` takes the config's ``loop:``/``train:`` value."""

    config_path: str | None
    iterations: int | None = None
    mode: str | None = None
    run: str | None = None
    out_dir: Path | None = None
    concurrency: int | None = None
    show_progress: bool = True
    ray_address: str | None = None
    """Play each iteration's rollout on Ray worker actors (:class:`dressage.cluster.ray_rollout.RayLoopWorkers`)."""
    log_to: tuple[str, ...] | None = None
    """``--log-to``: loggers of the step metrics (overrides ``train.log_to``)."""
    resume: str | None = None
    """``--resume RUN``: continue an interrupted loop from its last committed step and pushed version."""


@dataclass
class LoopReport:
    """What the loop did, iteration by iteration (numbers read back from the log)."""

    run: str
    mode: str
    iterations: list[IterationStats] = field(default_factory=list)
    out_dir: Path | None = None
    seconds: float = 0.0
    evals: list[EvalRound] = field(default_factory=list)
    eval_name: str = "eval"
    interrupted: str | None = None
    """Why the loop stopped before its last iteration (a signal, a stop request); None when it ended."""


def resolve(cfg: RolloutConfig, opts: LoopOptions) -> tuple[RolloutConfig, LoopConfig, TrainConfig, str]:
    """The config with command-line overrides applied, its loop and train sections, the run name."""
    loop_cfg = cfg.loop or LoopConfig()
    updates: dict[str, Any] = {}
    if opts.iterations is not None:
        updates["iterations"] = opts.iterations
    if opts.mode is not None:
        if opts.mode not in ("sync", "async"):
            raise ConfigError(f"--mode must be sync or async, got {opts.mode!r}")
        updates["mode"] = opts.mode
    loop_cfg = LoopConfig.model_validate({**loop_cfg.model_dump(), **updates})
    # a tree run (branching) trains with the tree estimator unless its train section says (and it must)
    train_cfg = cfg.train or TrainConfig(advantage_estimator="tree" if cfg.branching is not None else "grpo")
    if opts.log_to is not None:
        train_cfg = train_cfg.model_copy(update={"log_to": list(parse_log_to(opts.log_to))})
    if opts.concurrency is not None:
        if opts.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {opts.concurrency}")
        cfg = cfg.model_copy(
            update={"worker": cfg.worker.model_copy(update={"concurrency": opts.concurrency})}
        )
    run_name = opts.resume or opts.run or f"{cfg.run}-{loop_cfg.mode}"
    cfg = cfg.model_copy(update={"run": run_name, "loop": loop_cfg, "train": train_cfg})
    return cfg, loop_cfg, train_cfg, run_name


def resumed_config(store: EventStore, opts: LoopOptions) -> RolloutConfig:
    """The config of the loop run ``opts.resume`` from its frozen snapshot, with its ``loop:`` and
    ``train:`` sections; ``--mode`` may not change, ``--iterations`` may (the total to reach)."""
    assert opts.resume is not None
    run = store.runs.get(opts.resume)
    rollout, recorded = run.config.get("rollout"), run.config.get("loop")
    if not isinstance(rollout, dict) or not isinstance(recorded, dict):
        raise ConfigError(
            f"run {run.name!r} was not created by `dressage-worker loop`; continue a rollout with "
            f"`dressage-worker rollout --resume {run.name}`"
        )
    if opts.mode is not None and opts.mode != recorded["mode"]:
        raise ConfigError(f"run {run.name!r} is a {recorded['mode']} loop; --mode cannot change on --resume")
    cfg = parse_config(rollout, source=f"run {run.name!r} snapshot")
    loop_cfg = LoopConfig(mode=recorded["mode"], iterations=recorded["iterations"])
    return cfg.model_copy(update={"loop": loop_cfg, "train": TrainConfig.model_validate(recorded["train"])})


def iteration_specs(tasks: list[Any], iteration: int) -> list[TaskSpec]:
    """The dataset's tasks as iteration ``iteration``'s queue entries (indexes offset by ``k * n``)."""
    n = len(tasks)
    specs = []
    for t in tasks:
        index = iteration * n + t.index
        specs.append(TaskSpec(task_index=index, payload={**t.to_payload(), "index": index}))
    return specs


class Loop:
    """One loop's engine, proxy, trainer and schedule; :meth:`run` drives it (see the module doc)."""

    def __init__(
        self,
        store: EventStore,
        settings: Settings,
        opts: LoopOptions,
        console: Console,
        stop: StopFlag | None = None,
    ) -> None:
        self.store, self.opts, self.console = store, opts, console
        self.stop_flag = stop or StopFlag()
        """Set by SIGINT/SIGTERM (the command's handlers) or a stop request in the log: the loop
        finishes the training step in progress (committed, pushed), plays nothing more, and stops."""
        if opts.resume is None and opts.config_path is None:
            raise ConfigError("give --config run.yaml (a new loop) or --resume RUN")
        source = resumed_config(store, opts) if opts.resume else load_config(str(opts.config_path))
        self.cfg, self.loop_cfg, self.train_cfg, self.run_name = resolve(source, opts)
        self.admin_token = secrets.token_urlsafe(24)
        self.secrets = resolve_secrets(self.cfg.secrets)
        store.db.secrets = (*store.db.secrets, *self.secrets.values())
        self.settings = with_secrets(settings, self.secrets).model_copy(
            update={"admin_token": SecretStr(self.admin_token)}
        )
        sandbox = self.cfg.sandbox
        self.tasks = load_tasks(
            self.cfg.dataset.path, self.cfg.dataset.limit, sandbox.provider, self.cfg.dataset.loader
        )
        check_reward_fits(
            self.tasks, self.cfg.reward.kind, self.cfg.agent.kind, sandbox.provider, sandbox.e2b.templates
        )
        self.n_tasks = len(self.tasks)
        recorded_out = store.runs.get(opts.resume).config["loop"].get("out") if opts.resume else None
        self.out_dir = opts.out_dir or (
            Path(recorded_out) if recorded_out else settings.home / "loop" / self.run_name
        )
        per_iteration = self.n_tasks * self.cfg.n_samples_per_prompt
        gbs = self.train_cfg.global_batch_size or per_iteration
        if per_iteration % gbs:
            raise ConfigError(
                f"train.global_batch_size {gbs} must divide one iteration's {per_iteration} trajectories "
                f"({self.n_tasks} tasks x {self.cfg.n_samples_per_prompt} samples)"
            )
        self.global_batch_size = gbs
        self.steps_per_iteration = per_iteration // gbs
        self.engine: DevEngineProcess | None = None
        self.loggers = Loggers()
        """``train.log_to``'s loggers (W&B, TensorBoard), opened by :meth:`open_loggers`."""
        self.reader: EventStore | None = None
        """The trainer's read replica (``settings.replica_url``), opened with the trainer."""
        self.proxy: ServedProxy | None = None
        self.trainer: Trainer | None = None
        self.env: EpisodeEnv | None = None
        self.run: Run | None = None
        self.stats: list[IterationStats] = []
        self.evals: EvalScheduler | None = None
        self.ray_workers: Any = None
        self.sandbox_limits: LimitsInForce | None = None
        """What enforces the sandbox limits here (:meth:`start` asks the provider; the snapshot records it)."""
        self.pusher: WeightPusher | None = None
        self.committed = 0
        """Training steps committed so far (a resumed loop starts at its checkpoint's)."""
        self.first_iteration = 0
        """The first iteration this process plays (a resumed loop: the first not fully trained)."""
        self.watch: StopRequestWatch | None = None

    def snapshot(self) -> dict[str, Any]:
        """The run's frozen config: the rollout snapshot plus the loop's train/loop sections."""
        return {
            **run_snapshot(self.cfg, self.tasks, self.secrets, self.sandbox_limits),
            "loop": {
                "mode": self.loop_cfg.mode,
                "iterations": self.loop_cfg.iterations,
                "train": self.train_cfg.model_dump(mode="json"),
                "global_batch_size": self.global_batch_size,
                "consumer": CONSUMER,
                "out": str(self.out_dir),
            },
        }

    async def __aenter__(self) -> Loop:
        """``start()``; a start that fails half-way stops what it had started."""
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Check the run is new (or, resumed, a loop's), start the engine and the proxy, create the
        run, build the trainer; a resumed loop's engine gets the last pushed weights."""
        if self.opts.resume is None and self.run_name in {r.name for r in self.store.runs.list()}:
            raise ConfigError(
                f"run {self.run_name!r} already exists; a loop starts a new run: pass --run NEW-NAME"
            )
        cfg = self.cfg
        self.agent = build_agent(cfg.agent)  # checked before anything starts or is created
        if (
            isinstance(self.agent, BlackboxAgent)
            and cfg.sandbox.provider == "bwrap"
            and not cfg.sandbox.network
        ):
            raise ConfigError(
                "the loop runs whitebox agents (or sandboxes with network); for blackbox agents in "
                "bwrap run `dressage-worker rollout` and `dressage-worker train --follow --push-to` side by side"
            )
        provider = sandbox_provider(cfg)
        self.sandbox_limits = await sandbox_limits(provider, cfg, self.console)
        self.engine, proxy, urls = await start_engine_and_proxy(self.store, cfg, self.settings, self.console)
        self.proxy = proxy
        snapshot = self.store.runs.get(self.run_name).config if self.opts.resume else self.snapshot()
        self.run = await proxy.create_run(self.run_name, snapshot)
        self.watch = StopRequestWatch(self.store, self.run, self.stop_flag).attach()
        await asyncio.to_thread(self.store.versions.record, self.run, 0, None)
        await proxy.continue_generation(0)  # tokens of iteration 0 carry version 0
        agent = self.agent
        sandbox_url = cfg.proxy.public_url or proxy.base_url
        self.env = EpisodeEnv(
            self.store,
            proxy,
            self.run,
            cfg,
            agent,
            build_scorer(cfg.reward),
            provider,
            None,
            sandbox_url,
            self.secrets,
        )
        self.trainer = self._build_trainer(urls)
        if self.opts.resume is not None:
            await self._continue_where_stopped()
        if cfg.eval is not None:
            self.evals = EvalScheduler(self.store, self.run, cfg.eval, provider=cfg.sandbox.provider)
        if self.opts.ray_address is not None:
            from dressage.cluster import ray_rollout_module

            workers = ray_rollout_module().RayLoopWorkers
            self.ray_workers = workers(self.opts.ray_address, cfg, self.settings, self.console)
            await self.ray_workers.start(self.run, proxy.base_url)

    def _build_trainer(self, urls: list[str]) -> Trainer:
        from dressage.training.weight_push import WeightPusher

        assert self.run is not None and self.proxy is not None
        pusher = self.pusher = WeightPusher(
            self.store,
            urls,
            proxy_admin_urls=[self.proxy.base_url],
            admin_token=self.admin_token,
            every=self.steps_per_iteration,
            keep_last=1,
        )
        setup = TrainerSetup(
            run=self.run,
            consumer=CONSUMER,
            out=self.out_dir,
            n_samples_per_prompt=self.cfg.n_samples_per_prompt,
            model=self.cfg.engine.model,
            seed=self.cfg.engine.seed,
        )
        if self.reader is None:  # a streaming replica to read groups and turns from (--replica-url)
            self.reader = open_replica_store(self.settings)
        cfg = self.train_cfg.model_copy(update={"global_batch_size": self.global_batch_size})
        return build_trainer(cfg, self.store, setup, push=pusher, reader=self.reader)

    async def _continue_where_stopped(self) -> None:
        """A resumed loop: its committed steps, the iteration to go on with, and the engine serving
        the last pushed version (its weights directory, kept by the pusher, pushed again)."""
        assert self.run is not None and self.pusher is not None
        ckpt = await asyncio.to_thread(self.store.consumers.checkpoint, self.run, f"train:{CONSUMER}")
        self.committed = ckpt.step if ckpt is not None else 0
        self.first_iteration = min(self.committed // self.steps_per_iteration, self.loop_cfg.iterations)
        for k in range(self.first_iteration):
            self.stats.append(await asyncio.to_thread(read_iteration, self.store, self.run, k, self.n_tasks))
        version = await asyncio.to_thread(self.store.versions.latest, self.run) or 0
        if version > 0:
            pushed = await asyncio.to_thread(
                self.store.events.read, self.run, 0, 100_000, ("policy_version",)
            )
            uri = next(e.payload.get("checkpoint_uri") for e in pushed if e.payload["version"] == version)
            path = Path(url2pathname(urlsplit(uri).path)) if uri else None
            if path is None or not path.is_dir():
                raise ConfigError(
                    f"run {self.run_name!r}: the weights of its last pushed policy version {version} "
                    f"({uri}) are gone; the loop cannot continue with them"
                )
            await asyncio.to_thread(self.pusher.push, self.run, version, path)
        self.console.print(
            f"continuing loop {self.run_name} at iteration {self.first_iteration} "
            f"({self.committed} steps committed, policy version {version})",
            markup=False,
            soft_wrap=True,
        )

    def open_loggers(self) -> None:
        """Open ``train.log_to``'s loggers under the loop's output directory."""
        config = {"dressage_run": self.run_name, **self.cfg.model_dump(mode="json")}
        self.loggers = Loggers.open(self.train_cfg.log_to, self.out_dir, self.run_name, config)

    async def stop(self) -> None:
        """Stop the Ray workers, the proxy and the engine, close the replica reader and the loggers
        (idempotent)."""
        loggers, self.loggers = self.loggers, Loggers()
        loggers.close()
        if self.watch is not None:
            self.watch.detach()
            self.watch = None
        if self.ray_workers is not None:
            self.ray_workers.stop()
            self.ray_workers = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.proxy is not None:
            with logged_failures(log, "stopping the proxy"):
                await self.proxy.stop()
            self.proxy = None
        if self.engine is not None:
            self.engine.stop()
            self.engine = None

    async def rollout(self, k: int, progress: LoopProgress) -> IterationStats | None:
        """Enqueue iteration ``k``'s tasks and run episodes until they are all done; None when a stop
        came first (pairs are left pending or in flight for ``--resume``)."""
        assert self.env is not None and self.run is not None
        started = time.monotonic()
        specs = iteration_specs(self.tasks, k)
        await asyncio.to_thread(self.store.tasks.enqueue, self.run, specs, self.cfg.n_samples_per_prompt)
        report = RolloutReport(run=self.run_name)
        owner = f"{default_worker_id()}-loop"
        total = len(specs) * self.cfg.n_samples_per_prompt
        async with progress.rollout(k, total, already_done=k * total):
            if self.ray_workers is not None:
                await self.ray_workers.drain(self.store, self.run, self.stop_flag)
            else:
                await _lease_loop(self.env, owner, report, self.console, self.evals, self.stop_flag)
        counts = await asyncio.to_thread(self.store.tasks.counts, self.run)
        if counts["pending"] or counts["leased"]:  # stopped: the iteration is not played whole
            return None
        stats = await asyncio.to_thread(read_iteration, self.store, self.run, k, self.n_tasks)
        stats.rollout_s = time.monotonic() - started
        return stats

    async def train(self, k: int, stats: IterationStats, progress: LoopProgress) -> None:
        """Train the steps of iteration ``k``'s groups in a thread (the event loop keeps serving).

        A stop ends training after a step: the first step of a played iteration is trained (and
        pushed) even when the stop came while it was being formed, the rest are left to ``--resume``.
        """
        assert self.trainer is not None
        started = time.monotonic()
        due = (k + 1) * self.steps_per_iteration - self.committed  # fewer when a resumed loop stopped mid-way
        stepped: list[object] = []
        with progress.training(k):
            results = await asyncio.to_thread(
                self.trainer.run_steps,
                max_steps=due,
                on_step=stepped.append,
                should_stop=lambda: bool(stepped) and self.stop_flag.poll(),
            )
        self.committed += len(results)
        stats.train_steps = len(results)
        stats.train_s = time.monotonic() - started
        for result in results:
            self.loggers.step(result.batch.step, result.metrics)
        for warning in [w for r in results for w in r.warnings] + self.trainer.tail_warnings:
            self.console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)
        if results:
            stats.metrics = dict(results[-1].metrics)
            pushed = stats.metrics.get("pushed_version")
            stats.pushed_version = int(pushed) if pushed is not None else None
        if len(results) < due and not self.stop_flag.is_set():
            self.console.print(
                f"[yellow]iteration {k}: only {len(results)} of {self.steps_per_iteration} steps could be "
                "formed (groups without a finished session are dropped); the trainer catches up later[/]"
            )
        self._prune_checkpoints()

    def _prune_checkpoints(self) -> None:
        """Keep the newest ``train.keep_checkpoints`` step checkpoints (resume needs only the last)."""
        from dressage.training.torch_backend import TorchBackend

        assert self.trainer is not None and isinstance(self.trainer.backend, TorchBackend)
        self.trainer.backend.prune_checkpoints(self.train_cfg.keep_checkpoints)

    async def run_all(self, *, show_progress: bool) -> None:
        """Every iteration of the started loop, under one progress display (shown or not)."""
        assert self.run is not None, "start() the loop first"
        progress = LoopProgress(self.console, self.loop_cfg.iterations, enabled=show_progress)
        progress.attach(self.store, self.run)
        with progress:
            await self.run_iterations(progress)

    async def run_iterations(self, progress: LoopProgress) -> None:
        """The schedule: sync alternates rollout and training; async overlaps them by one iteration.

        A resumed loop starts at :attr:`first_iteration`; on :attr:`stop_flag` the rollout stops
        claiming, the training step in progress ends (committed, pushed; an iteration played whole
        trains at least its first step), and nothing more is played or trained.
        """
        k0, k_total = self.first_iteration, self.loop_cfg.iterations
        if self.loop_cfg.mode == "sync":
            for k in range(k0, k_total):
                stats = await self.rollout(k, progress)
                if stats is None:
                    return
                self.stats.append(stats)
                progress.iteration_done(stats)
                await self.train(k, stats, progress)
                if self.stop_flag.is_set():
                    return
            return
        trained = [asyncio.Event() for _ in range(k_total)]
        for k in range(k0):
            trained[k].set()
        rolled: list[asyncio.Future[IterationStats]] = [
            asyncio.get_running_loop().create_future() for _ in range(k_total)
        ]

        async def rollout_side() -> None:
            for k in range(k0, k_total):
                # at most one iteration ahead of the trainer
                if k >= 2 and not await self._unless_stopped(trained[k - 2].wait()):
                    return
                played = await self.rollout(k, progress)
                if played is None:
                    return
                progress.iteration_done(played)
                rolled[k].set_result(played)

        async def train_side() -> None:
            for k in range(k0, k_total):
                stats = await self._unless_stopped(rolled[k])
                if stats is None:
                    return
                self.stats.append(stats)
                await self.train(k, stats, progress)
                trained[k].set()
                if self.stop_flag.is_set():
                    return

        await asyncio.gather(rollout_side(), train_side())

    async def _unless_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """``awaitable``'s result, or None as soon as :attr:`stop_flag` is set."""
        waited = asyncio.ensure_future(awaitable)
        stopped = asyncio.ensure_future(self.stop_flag.wait())
        await asyncio.wait({waited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if waited.done():
            return waited.result()
        waited.cancel()
        return None

    async def final_eval(self) -> None:
        """Run the eval round of the last pushed version (earlier rounds ran inside the rollouts)."""
        if self.evals is None or self.env is None:
            return
        self.evals.min_interval_s = 0.0
        report = RolloutReport(run=self.run_name)
        with self.console.status("evaluating the last policy version"):
            owner = f"{default_worker_id()}-loop"
            await _lease_loop(self.env, owner, report, self.console, self.evals, self.stop_flag)

    def refresh_versions(self) -> None:
        """Re-read each iteration's token versions (async: pushes land while an iteration runs)."""
        assert self.run is not None
        for s in self.stats:
            fresh = read_iteration(self.store, self.run, s.iteration, self.n_tasks)
            s.versions, s.turns_spanning_push = fresh.versions, fresh.turns_spanning_push


async def run_loop(
    settings: Settings, opts: LoopOptions, console: Console | None = None, stop: StopFlag | None = None
) -> LoopReport:
    """Run the loop described by ``opts`` until its last iteration or ``stop``; see the module docstring."""
    console = console or Console(stderr=True)
    if opts.resume is None and opts.config_path is None:
        raise ConfigError("give --config run.yaml (a new loop) or --resume RUN")
    if opts.resume is None and opts.config_path is not None:
        load_new_run(opts.config_path)  # config, agent, reward and dataset checked before the log is opened
    store = EventStore.open(settings=settings)
    started = time.monotonic()
    try:
        loop = Loop(store, settings, opts, console, stop)
        async with loop:
            loop.open_loggers()
            await loop.run_all(show_progress=opts.show_progress)
            if not loop.stop_flag.is_set():
                await loop.final_eval()
            interrupted = loop.stop_flag.is_set()
            if not interrupted:
                await asyncio.to_thread(loop.refresh_versions)
                assert loop.run is not None
                loop.loggers.versions(version_rewards(store, loop.run))
        return LoopReport(
            run=loop.run_name,
            mode=loop.loop_cfg.mode,
            iterations=loop.stats,
            out_dir=loop.out_dir,
            seconds=time.monotonic() - started,
            evals=read_eval_rounds(store, loop.run_name)
            if loop.evals is not None and not interrupted
            else [],
            eval_name=loop.cfg.eval.name if loop.cfg.eval is not None else "eval",
            interrupted=loop.stop_flag.reason if interrupted else None,
        )
    finally:
        store.close()
