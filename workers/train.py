"""``dressage-worker train``: the replay trainer as a log consumer.

Tails a run's log, forms steps of ``--global-batch-size`` trajectories from ready groups (a tree
counts its roots), trains (``torch``), writes slime rollout files (``slime-dump``) or only records (``none``), and commits
each step's manifest with the consumer checkpoint. ``--replay`` re-forms every recorded step and
checks its hash. torch and transformers are imported inside the command.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from dressage.commandline import handle_errors
from dressage.errors import ConfigError
from dressage.training.config import TrainConfig, TrainerSetup, build_backend, build_trainer, step_options

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from dressage.interrupts import StopFlag
    from dressage.store import EventStore
    from dressage.store.records import Run
    from dressage.training.consumer import Backend, Trainer
    from dressage.training.loggers import Loggers
    from dressage.training.steps import StepOptions
    from dressage.training.weight_push import WeightPusher


_DEFAULTS = TrainConfig()
"""The options' defaults are :class:`TrainConfig`'s: ``train`` and ``loop`` train alike."""

_FromRuns = Annotated[
    list[str] | None,
    typer.Option(
        "--from-run",
        help="Run whose log to train on; repeat it to train on several runs (steps are recorded in the first).",
    ),
]
_FromExports = Annotated[
    list[Path] | None,
    typer.Option(
        "--from-export",
        help="Export directory to train on (verified, imported once as RUN@export-HASH; after the "
        "--from-run runs). Repeatable.",
    ),
]
_VersionOffsets = Annotated[
    list[int] | None,
    typer.Option(
        "--version-offset",
        help="With several --from-run: per run, added to its policy versions for the staleness rules "
        "(default 0 each).",
    ),
]
_ReplicaUrl = Annotated[
    str | None,
    typer.Option(
        help="Read groups and turns from this PostgreSQL streaming replica (default: DRESSAGE_REPLICA_URL); "
        "steps are committed to the primary."
    ),
]
_PushTo = Annotated[
    str | None,
    typer.Option(
        help="torch: engine URL[,URL...] to push each new policy to (pause, update_weights_from_disk, resume)."
    ),
]
_ProxyAdminUrl = Annotated[
    str | None,
    typer.Option(
        help="Pause/resume through these TITO proxies, URL[,URL...] (every proxy of a proxy.urls deployment; "
        "token: DRESSAGE_ADMIN_TOKEN) instead of the engines."
    ),
]
_LogTo = Annotated[
    str | None,
    typer.Option(
        "--log-to",
        help="Also log step metrics and rewards to wandb,tensorboard (under --out; extras dressage[wandb], "
        "dressage[tensorboard]).",
    ),
]
_Out = Annotated[
    Path | None, typer.Option(help="Checkpoints or rollout files (default: <home>/train/<run>).")
]


_Consumer = Annotated[str, typer.Option(help="Consumer name; the checkpoint is kept as train:<name>.")]
_Backend = Annotated[str, typer.Option(help="torch | slime-dump | none")]
_GlobalBatchSize = Annotated[
    int,
    typer.Option(
        help="Trajectories per optimizer step, in whole groups of --n-samples-per-prompt; a tree counts "
        "its roots (a step of 8 with one root per task takes 8 trees, forks included)."
    ),
]
_NSamplesPerPrompt = Annotated[int | None, typer.Option(help="Samples per group (default: the run's).")]
_Follow = Annotated[bool, typer.Option("--follow", help="Keep tailing the log for new groups.")]
_Replay = Annotated[bool, typer.Option("--replay", help="Re-form every recorded step and check its hash.")]
_KeepCheckpoints = Annotated[int, typer.Option(help="torch: newest checkpoints kept.")]
_DatabaseUrl = Annotated[str | None, typer.Option(help="Event log URL (default: DRESSAGE_DATABASE_URL).")]
_MaxStaleness = Annotated[int | None, typer.Option(help="Mask tokens older than this many versions.")]
_LastVersionOnly = Annotated[bool, typer.Option(help="Train only tokens of a segment's newest version.")]
_GroupVersionWindow = Annotated[int | None, typer.Option(help="Drop groups with tokens older than this.")]
_FailurePolicy = Annotated[str, typer.Option(help="drop_group | keep_finished")]
_StalenessReference = Annotated[
    str,
    typer.Option(
        help="Measure staleness against the trainer's version or the data's newest version: trainer | data | "
        "auto (trainer with --push-to, else data: a recorded run trains its own data)."
    ),
]
_EmptySteps = Annotated[
    str,
    typer.Option(help="A step that would train 0 tokens: stop (commit nothing, say why) | skip its groups."),
]
_WarnEntropyBelow = Annotated[
    float | None, typer.Option(help="torch: warn when the mean entropy (nats) stays below this.")
]
_WarnGradNormAtMost = Annotated[
    float | None, typer.Option(help="torch: warn when grad_norm stays at most this.")
]
_WarnAfterSteps = Annotated[int, typer.Option(help="Consecutive steps before those two warnings.")]
_AdvantageEstimator = Annotated[
    str | None,
    typer.Option(
        help="Registered advantage estimator (default: the loop's train.advantage_estimator recorded in "
        "the run's config; else tree for a tree run, grpo otherwise)."
    ),
]
_StdNormalize = Annotated[bool, typer.Option(help="Divide GRPO advantages by the group's std + eps.")]
_InitialVersion = Annotated[int, typer.Option(help="Policy version of the weights before step 1.")]
_MaxSteps = Annotated[int | None, typer.Option(help="Stop after this many new steps.")]
_Model = Annotated[str, typer.Option(help="torch: 'tiny', 'tiny-qwen3' or an HF model directory.")]
_Seed = Annotated[int, typer.Option(help="torch: seed of a tiny random model.")]
_Lr = Annotated[float, typer.Option(help="torch: learning rate.")]
_Optimizer = Annotated[str, typer.Option(help="torch: sgd | adam (its state is checkpointed each step).")]
_Trainable = Annotated[str, typer.Option(help="torch: all | lm_head (train only the output projection).")]
_Reference = Annotated[
    str | None,
    typer.Option(
        help="torch: 'initial' keeps a frozen copy of the starting weights; kl_reference is logged."
    ),
]
_KlCoef = Annotated[float, typer.Option(help="torch: add kl_coef * KL(trainer || reference) to the loss.")]
_PushEvery = Annotated[int, typer.Option(help="Push after every N-th step.")]
_PushKeep = Annotated[int | None, typer.Option(help="Keep only the newest N pushed weight directories.")]
_ThrottleS = Annotated[float, typer.Option(help="Pause between steps (demos, crash tests).")]


@dataclass(frozen=True)
class PushOptions:
    """``--push-to`` and its companions: where each new policy goes."""

    push_to: str | None
    proxy_admin_url: str | None
    every: int
    keep: int | None


@dataclass(frozen=True)
class TrainRequest:
    """What ``train`` reads and writes: the runs and exports, the consumer and backend, the output."""

    from_runs: list[str]
    from_exports: list[Path]
    version_offsets: list[int] | None
    consumer: str
    backend: str
    out: Path | None
    push: PushOptions
    log_to: tuple[str, ...]
    estimator_from_run: bool = False
    """No --advantage-estimator: the run's recorded one (:func:`recorded_estimator`)."""


@dataclass(frozen=True)
class TrainStart:
    """Where training starts: the group size (default: the run's), the model and its version."""

    n_samples_per_prompt: int | None
    model: str
    seed: int
    initial_version: int


@dataclass(frozen=True)
class Pace:
    """Whether to follow the log or replay it, and how many steps how fast."""

    follow: bool
    replay: bool
    max_steps: int | None
    throttle_s: float
    stop: StopFlag | None = None
    """Set by SIGINT/SIGTERM (or a stop request in the run's log): training ends after the step in
    progress is committed (:mod:`dressage.interrupts`)."""


@handle_errors
def train_command(
    from_runs: _FromRuns = None,
    from_exports: _FromExports = None,
    version_offsets: _VersionOffsets = None,
    consumer: _Consumer = "main",
    backend: _Backend = "torch",
    global_batch_size: _GlobalBatchSize = 8,
    n_samples_per_prompt: _NSamplesPerPrompt = None,
    follow: _Follow = False,
    replay: _Replay = False,
    out: _Out = None,
    keep_checkpoints: _KeepCheckpoints = _DEFAULTS.keep_checkpoints,
    database_url: _DatabaseUrl = None,
    replica_url: _ReplicaUrl = None,
    max_staleness: _MaxStaleness = _DEFAULTS.max_staleness,
    last_version_only: _LastVersionOnly = False,
    group_version_window: _GroupVersionWindow = None,
    failure_policy: _FailurePolicy = _DEFAULTS.failure_policy,
    staleness_reference: _StalenessReference = _DEFAULTS.staleness_reference,
    empty_steps: _EmptySteps = _DEFAULTS.empty_steps,
    warn_entropy_below: _WarnEntropyBelow = _DEFAULTS.warn_entropy_below,
    warn_grad_norm_at_most: _WarnGradNormAtMost = _DEFAULTS.warn_grad_norm_at_most,
    warn_after_steps: _WarnAfterSteps = _DEFAULTS.warn_after_steps,
    advantage_estimator: _AdvantageEstimator = None,
    std_normalize: _StdNormalize = False,
    initial_version: _InitialVersion = 0,
    max_steps: _MaxSteps = None,
    model: _Model = "tiny",
    seed: _Seed = 0,
    lr: _Lr = _DEFAULTS.lr,
    optimizer: _Optimizer = _DEFAULTS.optimizer,
    trainable: _Trainable = _DEFAULTS.trainable,
    reference: _Reference = None,
    kl_coef: _KlCoef = _DEFAULTS.kl_coef,
    push_to: _PushTo = None,
    proxy_admin_url: _ProxyAdminUrl = None,
    push_every: _PushEvery = 1,
    push_keep: _PushKeep = None,
    throttle_s: _ThrottleS = 0.0,
    log_to: _LogTo = None,
) -> None:
    """Train on a run's log, or replay its recorded steps."""
    from dressage.interrupts import graceful_stop
    from dressage.training.loggers import parse_log_to

    loggers = parse_log_to(log_to)
    if not from_runs and not from_exports:
        raise ConfigError("train needs a --from-run RUN or a --from-export DIR")
    check_train_options(
        out=out or Path(), lr=lr, global_batch_size=global_batch_size, n_samples=n_samples_per_prompt
    )
    # every option named after a TrainConfig field (--log-to is parsed above), validated by it
    cfg = train_config(
        **{
            k: v
            for k, v in locals().items()
            if k in TrainConfig.model_fields and k not in ("log_to", "advantage_estimator")
        },
        advantage_estimator=advantage_estimator or _DEFAULTS.advantage_estimator,
    )
    push = PushOptions(push_to, proxy_admin_url, push_every, push_keep)
    request = TrainRequest(
        list(from_runs or []),
        list(from_exports or []),
        version_offsets,
        consumer,
        backend,
        out,
        push,
        loggers,
        estimator_from_run=advantage_estimator is None,
    )
    start = TrainStart(n_samples_per_prompt, model, seed, initial_version)
    pace = Pace(follow, replay, max_steps, throttle_s, None if replay else graceful_stop())
    run_train(cfg, request, start, pace, (database_url, replica_url))


def run_train(
    cfg: TrainConfig,
    request: TrainRequest,
    start: TrainStart,
    pace: Pace,
    urls: tuple[str | None, str | None],
) -> None:
    """Open the log (and its replica), import the exports, then train or replay; a failed first run
    leaves no empty ``--out`` folder behind."""
    from dressage.commandline import console as make_console
    from dressage.config import load_settings, require_database_file
    from dressage.store import EventStore
    from dressage.store.replica import open_replica_store

    console = make_console(stderr=True)
    settings = load_settings(database_url=urls[0], replica_url=urls[1])
    first = request.from_runs[0] if request.from_runs else request.from_exports[0].name
    out = request.out if request.out is not None else settings.home / "train" / first
    if not request.from_exports:  # importing an export writes the log: it may create the file
        require_database_file(settings.resolved_database_url())
    store = EventStore.open(settings=settings)
    out_existed = out.exists()
    reader = None
    try:
        reader = open_replica_store(settings)
        runs = [*request.from_runs, *_import_exports(console, store, request.from_exports, reader)]
        for name in runs:
            store.runs.get(name)  # an unknown run fails before any output is written
        if pace.replay:
            _replay_runs(console, store, runs, request.consumer, reader)
        else:
            _train_runs(console, (store, reader), runs, cfg, (request, start, pace), out)
    except BaseException:
        if not out_existed:
            remove_if_empty(out)
        raise
    finally:
        if reader is not None:
            reader.close()
        store.close()


def _replay_runs(
    console: Console, store: EventStore, runs: list[str], consumer: str, reader: EventStore | None
) -> None:
    if len(runs) > 1:
        _replay_many(console, store, runs, consumer)
    else:
        _replay(console, store, runs[0], consumer, reader)


def _train_runs(
    console: Console,
    stores: tuple[EventStore, EventStore | None],
    runs: list[str],
    cfg: TrainConfig,
    asked: tuple[TrainRequest, TrainStart, Pace],
    out: Path,
) -> None:
    """Build the backend, then train one run (its trainer from :func:`build_trainer`) or several."""
    (store, reader), (request, start, pace) = stores, asked
    n_samples = start.n_samples_per_prompt or recorded_samples_per_prompt(store, runs[0])
    if request.estimator_from_run:
        cfg = cfg.model_copy(update={"advantage_estimator": recorded_estimator(store, runs[0])})
    setup = TrainerSetup(
        runs[0],
        request.consumer,
        out,
        n_samples,
        request.backend,
        start.model,
        start.seed,
        start.initial_version,
    )
    pusher = _pusher(store, setup, request.push)
    chosen = _slime_dump(setup) if request.backend == "slime-dump" else build_backend(cfg, setup, pusher)
    if len(runs) > 1:
        if pace.follow or reader is not None:
            raise ConfigError("several --from-run train on finished logs: without --follow and a replica")
        if request.log_to:
            raise ConfigError("--log-to applies to one --from-run (its step metrics are in the log)")
        offsets = request.version_offsets
        options = step_options(cfg, setup, pushes=pusher is not None)
        _train_many(console, store, (runs, offsets), setup.consumer, (options, cfg), chosen, pace)
    else:
        trainer = build_trainer(cfg, store, setup, chosen, push=pusher, reader=reader)
        if not pace.follow and not _has_work(console, trainer):
            return
        _train(console, trainer, pace, _open_loggers(request.log_to, out, trainer.run))
    prune = getattr(chosen, "prune_checkpoints", None)
    if prune is not None:
        prune(cfg.keep_checkpoints)


def train_config(**options: object) -> TrainConfig:
    """The :class:`TrainConfig` of the command's options; a bad value is one line naming its option."""
    try:
        return TrainConfig.model_validate(options)
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "train options"
        raise ConfigError(f"{flag}: {err['msg']}") from None


def _pusher(store: EventStore, setup: TrainerSetup, push: PushOptions) -> WeightPusher | None:
    """The weight pusher of ``--push-to`` (torch only), else None."""
    if push.push_to is None:
        if push.proxy_admin_url is not None:
            raise ConfigError("--proxy-admin-url only applies with --push-to ENGINE_URL[,URL...]")
        return None
    if setup.backend != "torch":
        raise ConfigError(f"--push-to needs --backend torch (the {setup.backend!r} backend trains nothing)")
    from dressage.training.weight_push import WeightPusher, parse_urls

    admin = parse_urls(push.proxy_admin_url, "--proxy-admin-url") if push.proxy_admin_url else ()
    return WeightPusher(
        store,
        parse_urls(push.push_to, "--push-to"),
        proxy_admin_urls=admin,
        every=push.every,
        keep_last=push.keep,
    )


def _slime_dump(setup: TrainerSetup) -> Backend:
    from dressage.integrations.slime import SlimeDumpBackend

    return SlimeDumpBackend(setup.out)


def _import_exports(
    console: Console, store: EventStore, dirs: list[Path], reader: EventStore | None
) -> list[str]:
    """The run names of ``--from-export`` directories, imported into the log when not already there."""
    from dressage.exports.source import run_from_export

    if dirs and reader is not None:
        raise ConfigError("--from-export imports into the primary; train on it without a replica")
    names = [run_from_export(store, d) for d in dirs]
    for d, name in zip(dirs, names, strict=True):
        console.print(f"export {d} is run {name!r} in this log", markup=False)
    return names


def check_train_options(*, out: Path, lr: float, global_batch_size: int, n_samples: int | None) -> None:
    """Refuse option values that cannot work, before the log is opened or anything is written."""
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"--lr must be a positive number, got {lr}")
    if global_batch_size < 1:
        raise ConfigError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    if n_samples is not None and n_samples < 1:
        raise ConfigError(f"--n-samples-per-prompt must be >= 1, got {n_samples}")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is an existing file; give a directory (it is created if missing)")


def recorded_samples_per_prompt(store: EventStore, run: str) -> int:
    """``n_samples_per_prompt`` of the run's frozen rollout config (4 for a run without one): the
    groups the rollout enqueued are what the trainer must wait for."""
    rollout = store.runs.get(run).config.get("rollout") or {}
    value = rollout.get("n_samples_per_prompt") if isinstance(rollout, dict) else None
    return int(value) if isinstance(value, int) and value >= 1 else 4


def recorded_estimator(store: EventStore, run: str) -> str:
    """The advantage estimator ``train`` uses without ``--advantage-estimator``: the one a loop
    recorded in its run's config (``loop.train.advantage_estimator``), else ``tree`` for a tree run
    (its config has ``branching``: the loop's default, and the only estimator a tree trains with),
    else ``grpo``. A rollout's snapshot holds no ``train:`` section: a run.yaml's is not in the log."""
    config = store.runs.get(run).config
    loop = config.get("loop")
    train = loop.get("train") if isinstance(loop, dict) else None
    if isinstance(train, dict) and isinstance(train.get("advantage_estimator"), str):
        return str(train["advantage_estimator"])
    rollout = config.get("rollout")
    return "tree" if isinstance(rollout, dict) and rollout.get("branching") else _DEFAULTS.advantage_estimator


def report_waiting_groups(console: Console, trainer: Trainer) -> None:
    """Name the ready groups no step took (fewer than a step needs), each with its sessions, and
    how to train them: without this, trees left over by ``--global-batch-size`` went untrained
    without a word."""
    waiting = trainer.waiting_groups
    if not waiting:
        return
    options = trainer.options
    groups = ", ".join(
        f"group {g.group_index} ({len(g.members) + len(g.forks)} sessions"
        + (f", a tree with {len(g.forks)} forks)" if g.forks else ")")
        for g in waiting
    )
    console.print(
        f"not trained: {len(waiting)} ready group(s) wait for a full step of {options.groups_per_step} "
        f"groups (--global-batch-size {options.global_batch_size} / {options.n_samples_per_prompt} samples "
        f"per group): {groups}; train them with --global-batch-size "
        f"{len(waiting) * options.n_samples_per_prompt}, or wait for more with --follow",
        markup=False,
        soft_wrap=True,
        style="yellow",
    )


def _has_work(console: Console, trainer: Trainer) -> bool:
    """Whether a new step can be formed now; if not, say why before any model is loaded.

    A run whose sessions all ended without one finishing is an error that counts them by status and
    gives the query showing why; a rerun with nothing new is not an error. The groups read stay
    pending in ``trainer``: its ``run_steps`` starts from them.
    """
    from dressage.errors import TrainingError
    from dressage.training.health import unformed_warning

    if trainer.has_new_step():
        return True
    _print_warnings(console, [w for w in [unformed_warning(trainer.builder.unformed_skips)] if w])
    store, run, options = trainer.store, trainer.run.name, trainer.options
    done = len(store.consumers.steps(run, trainer.consumer))
    sessions = store.runs.summary(run).sessions
    if not done and sessions and not sessions.get("finished") and not sessions.get("running"):
        counts = ", ".join(f"{n} {status}" for status, n in sorted(sessions.items()))
        raise TrainingError(
            f"nothing to train on in run {run!r}: no session finished ({counts}); "
            f'see why with `dressage-worker sql "select error, count(*) from sessions group by error"`'
        )
    console.print(
        f"nothing new to train: {trainer.consumer} of run {run!r} has {done} step(s) committed and the log "
        f"holds no further {options.global_batch_size} trajectories in whole groups of "
        f"{options.n_samples_per_prompt} (0 new steps; the model was not loaded)",
        markup=False,
        soft_wrap=True,
    )
    report_waiting_groups(console, trainer)
    return False


def remove_if_empty(path: Path) -> None:
    """Remove ``path`` when it is an empty directory (a failed run leaves no empty output folder)."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _progress(console: Console) -> Progress:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console)


def _replay(
    console: Console, store: EventStore, run: str, consumer: str, reader: EventStore | None = None
) -> None:
    from dressage.training.consumer import Trainer, consumer_name
    from dressage.training.steps import StepBatch, StepOptions

    steps = store.consumers.steps(run, consumer_name(consumer))
    if not steps:
        console.print(
            f"nothing to replay: no recorded steps for {consumer_name(consumer)} of run {run!r}", markup=False
        )
        return
    formed_from = steps[0].manifest.get("runs")
    if formed_from is not None and formed_from != [run]:
        raise ConfigError(
            f"the recorded steps were formed from runs {formed_from}; replay with a --from-run each"
        )
    options = StepOptions.from_dict(steps[0].manifest["options"])
    trainer = Trainer(store, run, options, consumer=consumer, reader=reader)
    with _progress(console) as bar:
        task = bar.add_task("replay", total=len(steps))

        def replayed(batch: StepBatch) -> None:
            bar.update(task, advance=1, description=f"replay step {batch.step}: hash matches")

        trainer.replay(on_step=replayed)
    console.print(
        f"replayed {len(steps)} steps of {trainer.consumer}: every batch hash matches", markup=False
    )


def _train(console: Console, trainer: Trainer, pace: Pace, loggers: Loggers | None = None) -> None:
    from rich.markup import escape

    from dressage.rollout.stop_requests import StopRequestWatch
    from dressage.training.consumer import StepResult, manifest_summary
    from dressage.training.loggers import Loggers, version_rewards

    follow, max_steps, throttle_s = pace.follow, pace.max_steps, pace.throttle_s
    loggers = loggers or Loggers()
    store, run, options, backend = trainer.store, trainer.run.name, trainer.options, trainer.backend
    with _progress(console) as bar:
        task = bar.add_task(escape(f"{trainer.consumer} on {run}"), total=max_steps)

        def stepped(result: StepResult) -> None:
            s = manifest_summary(result.batch)
            metrics = " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
            bar.update(
                task,
                advance=1,
                description=(
                    f"step {s['step']}: {s['trajectories']} traj, {s['samples']} samples, "
                    f"{s['tokens']} tokens, {s['dropped']} groups dropped {metrics}"
                ),
            )
            bar.console.print(
                f"step {result.batch.step} {result.batch.batch_hash}", highlight=False, soft_wrap=True
            )
            _print_warnings(bar.console, result.warnings)
            loggers.step(result.batch.step, result.metrics)

        watch = StopRequestWatch(store, run, pace.stop).attach() if pace.stop is not None else None
        try:
            results = trainer.run_steps(
                follow=follow,
                max_steps=max_steps,
                throttle_s=throttle_s,
                on_step=stepped,
                should_stop=pace.stop.poll if pace.stop is not None else None,
            )
            loggers.versions(version_rewards(store, run))  # training and eval reward per version
        finally:
            loggers.close()
            if watch is not None:
                watch.detach()
    _print_warnings(console, trainer.tail_warnings)
    tokens = sum(r.batch.n_trainable for r in results)
    console.print(
        f"{len(results)} new steps committed for {trainer.consumer} ({tokens} tokens trained; staleness "
        f"against the {options.masking.staleness_reference}'s versions)",
        markup=False,
    )
    _check_interrupted(
        pace, f"--from-run {run}", trainer.consumer, len(store.consumers.steps(run, trainer.consumer))
    )
    if not follow and (max_steps is None or len(results) < max_steps):
        report_waiting_groups(console, trainer)
    _report_evals(console, store, run)
    pattern = getattr(backend, "pattern", None)
    if pattern is not None:
        from dressage.integrations.slime import slime_command, slime_rollout_command

        total = len(store.consumers.steps(run, trainer.consumer))
        console.print(slime_command(str(pattern), options, total), highlight=False, soft_wrap=True)
        console.print("or let slime ask the log for each step (launcher: docs/architecture.md):")
        console.print(slime_rollout_command(run, options), highlight=False, soft_wrap=True)


def _check_interrupted(pace: Pace, runs: str, consumer: str, steps: int) -> None:
    """Raise :class:`Interrupted` (how to go on) when a signal or a stop request ended training."""
    from dressage.errors import Interrupted

    if pace.stop is not None and pace.stop.is_set():
        name = consumer.removeprefix("train:")
        raise Interrupted(
            f"resume with dressage-worker train {runs} --consumer {name} (and the same options: it "
            f"continues after step {steps})",
            pace.stop.exit_code,
        )


def _train_many(
    console: Console,
    store: EventStore,
    sources: tuple[list[str], list[int] | None],
    consumer: str,
    configured: tuple[StepOptions, TrainConfig],
    backend: Backend,
    pace: Pace,
) -> None:
    from dressage.training.multirun import MultiRunTrainer

    (runs, offsets), (options, cfg) = sources, configured
    trainer = MultiRunTrainer(
        store,
        runs,
        options,
        backend,
        consumer=consumer,
        version_offsets=offsets,
        watch=cfg.collapse_watch(),
    )
    should_stop = pace.stop.poll if pace.stop is not None else None
    for batch in trainer.run_steps(max_steps=pace.max_steps, should_stop=should_stop):
        origins = sorted({e["run"] for e in batch.manifest["samples"]})
        console.print(
            f"step {batch.step} {batch.batch_hash} ({len(batch.samples)} samples from {', '.join(origins)})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        _print_warnings(console, trainer.warnings.get(batch.step, []))
    total = len(store.consumers.steps(runs[0], trainer.consumer))
    console.print(f"{total} steps recorded for {trainer.consumer} in run {runs[0]!r}", markup=False)
    _check_interrupted(pace, " ".join(f"--from-run {r}" for r in runs), consumer, total)


def _print_warnings(console: Console, warnings: list[str]) -> None:
    """A step's warnings (also in its manifest and on the ``dressage.training`` logger), in yellow."""
    from rich.markup import escape

    for w in warnings:
        console.print(f"[yellow]warning: {escape(w)}[/]", highlight=False, soft_wrap=True)


def _replay_many(console: Console, store: EventStore, runs: list[str], consumer: str) -> None:
    from dressage.training.consumer import consumer_name
    from dressage.training.multirun import MultiRunTrainer
    from dressage.training.steps import StepOptions

    steps = store.consumers.steps(runs[0], consumer_name(consumer))
    if not steps:
        console.print(
            f"nothing to replay: no recorded steps for {consumer_name(consumer)} of run {runs[0]!r}"
        )
        return
    first = steps[0].manifest
    if first.get("runs") != runs:
        raise ConfigError(f"the recorded steps were formed from runs {first.get('runs')}; replay with those")
    options = StepOptions.from_dict(first["options"])
    trainer = MultiRunTrainer(
        store, runs, options, consumer=consumer, version_offsets=first["version_offsets"]
    )
    trainer.replay()
    console.print(
        f"replayed {len(steps)} steps of {trainer.consumer}: every batch hash matches", markup=False
    )


def _open_loggers(names: tuple[str, ...], out: Path, run: Run) -> Loggers:
    """The ``--log-to`` loggers, writing under ``out``."""
    from dressage.training.loggers import Loggers

    return Loggers.open(names, out, run.name, {"dressage_run": run.name, **run.config})


def _report_evals(console: Console, store: EventStore, run: str) -> None:
    """The run's eval rewards per policy version (eval sessions are never trained)."""
    from dressage.rollout.evaluation import eval_line, read_eval_rounds

    rounds = read_eval_rounds(store, run)
    if rounds:
        eval_cfg = store.runs.get(run).config.get("rollout", {}).get("eval") or {}
        console.print(eval_line(rounds, str(eval_cfg.get("name") or "eval")), highlight=False, soft_wrap=True)
