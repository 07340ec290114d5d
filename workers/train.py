"""``dressage-worker train``: the replay trainer as a log consumer.

Tails a run's log, forms steps of ``--global-batch-size`` trajectories from ready groups, trains
(``torch``), writes slime rollout files (``slime-dump``) or only records (``none``), and commits
each step's manifest with the consumer checkpoint. ``--replay`` re-forms every recorded step and
checks its hash. torch and transformers are imported inside the command.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError

from dressage.commandline import handle_errors
from dressage.errors import ConfigError
from dressage.training.config import TrainConfig, TrainerSetup, build_backend, step_options

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from dressage.store import EventStore
    from dressage.store.records import Run
    from dressage.training.consumer import Backend
    from dressage.training.loggers import Loggers
    from dressage.training.steps import StepOptions
    from dressage.training.weight_push import WeightPusher


_DEFAULTS = TrainConfig()
"""The options' defaults are :class:`TrainConfig`'s: ``train`` and ``loop`` train alike."""


@handle_errors
def train_command(
    from_runs: list[str] | None = typer.Option(
        None,
        "--from-run",
        help="Run whose log to train on; repeat it to train on several runs (steps are recorded in the first).",
    ),
    from_exports: list[Path] | None = typer.Option(
        None,
        "--from-export",
        help="Export directory to train on (verified, imported once as RUN@export-HASH; after the "
        "--from-run runs). Repeatable.",
    ),
    version_offsets: list[int] | None = typer.Option(
        None,
        "--version-offset",
        help="With several --from-run: per run, added to its policy versions for the staleness rules "
        "(default 0 each).",
    ),
    consumer: str = typer.Option("main", help="Consumer name; the checkpoint is kept as train:<name>."),
    backend: str = typer.Option("torch", help="torch | slime-dump | none"),
    global_batch_size: int = typer.Option(8, help="Trajectories per optimizer step (whole groups)."),
    n_samples_per_prompt: int | None = typer.Option(None, help="Samples per group (default: the run's)."),
    follow: bool = typer.Option(False, "--follow", help="Keep tailing the log for new groups."),
    replay: bool = typer.Option(False, "--replay", help="Re-form every recorded step and check its hash."),
    out: Path | None = typer.Option(None, help="Checkpoints or rollout files (default: <home>/train/<run>)."),
    keep_checkpoints: int = typer.Option(_DEFAULTS.keep_checkpoints, help="torch: newest checkpoints kept."),
    database_url: str | None = typer.Option(None, help="Event log URL (default: DRESSAGE_DATABASE_URL)."),
    replica_url: str | None = typer.Option(
        None,
        help="Read groups and turns from this PostgreSQL streaming replica (default: DRESSAGE_REPLICA_URL); "
        "steps are committed to the primary.",
    ),
    max_staleness: int | None = typer.Option(
        _DEFAULTS.max_staleness, help="Mask tokens older than this many versions."
    ),
    last_version_only: bool = typer.Option(False, help="Train only tokens of a segment's newest version."),
    group_version_window: int | None = typer.Option(None, help="Drop groups with tokens older than this."),
    failure_policy: str = typer.Option(_DEFAULTS.failure_policy, help="drop_group | keep_finished"),
    advantage_estimator: str = typer.Option(
        _DEFAULTS.advantage_estimator, help="Registered advantage estimator."
    ),
    std_normalize: bool = typer.Option(False, help="Divide GRPO advantages by the group's std + eps."),
    initial_version: int = typer.Option(0, help="Policy version of the weights before step 1."),
    max_steps: int | None = typer.Option(None, help="Stop after this many new steps."),
    model: str = typer.Option("tiny", help="torch: 'tiny', 'tiny-qwen3' or an HF model directory."),
    seed: int = typer.Option(0, help="torch: seed of a tiny random model."),
    lr: float = typer.Option(_DEFAULTS.lr, help="torch: learning rate."),
    optimizer: str = typer.Option(
        _DEFAULTS.optimizer, help="torch: sgd | adam (its state is checkpointed each step)."
    ),
    trainable: str = typer.Option(
        _DEFAULTS.trainable, help="torch: all | lm_head (train only the output projection)."
    ),
    push_to: str | None = typer.Option(
        None,
        help="torch: engine URL[,URL...] to push each new policy to (pause, update_weights_from_disk, resume).",
    ),
    proxy_admin_url: str | None = typer.Option(
        None,
        help="Pause/resume through these TITO proxies, URL[,URL...] (every proxy of a proxy.urls deployment; "
        "token: DRESSAGE_ADMIN_TOKEN) instead of the engines.",
    ),
    push_every: int = typer.Option(1, help="Push after every N-th step."),
    push_keep: int | None = typer.Option(None, help="Keep only the newest N pushed weight directories."),
    throttle_s: float = typer.Option(0.0, help="Pause between steps (demos, crash tests)."),
    log_to: str | None = typer.Option(
        None,
        "--log-to",
        help="Also log step metrics and rewards to wandb,tensorboard (under --out; extras dressage[wandb], "
        "dressage[tensorboard]).",
    ),
) -> None:
    """Train on a run's log, or replay its recorded steps."""
    from dressage.commandline import console as make_console
    from dressage.config import load_settings, require_database_file
    from dressage.store import EventStore
    from dressage.store.replica import open_replica_store
    from dressage.training.loggers import parse_log_to

    console = make_console(stderr=True)
    loggers = parse_log_to(log_to)
    if not from_runs and not from_exports:
        raise ConfigError("train needs a --from-run RUN or a --from-export DIR")
    check_train_options(
        out=out or Path(), lr=lr, global_batch_size=global_batch_size, n_samples=n_samples_per_prompt
    )
    cfg = train_config(
        keep_checkpoints=keep_checkpoints,
        lr=lr,
        optimizer=optimizer,
        trainable=trainable,
        global_batch_size=global_batch_size,
        advantage_estimator=advantage_estimator,
        std_normalize=std_normalize,
        max_staleness=max_staleness,
        last_version_only=last_version_only,
        group_version_window=group_version_window,
        failure_policy=failure_policy,
    )
    settings = load_settings(database_url=database_url, replica_url=replica_url)
    first = from_runs[0] if from_runs else Path(from_exports[0] if from_exports else ".").name
    out = out if out is not None else settings.home / "train" / first
    require_database_file(settings.resolved_database_url())
    store = EventStore.open(settings=settings)
    out_existed = out.exists()
    reader = None
    try:
        reader = open_replica_store(settings)
        from_runs = [*(from_runs or []), *_import_exports(console, store, from_exports or [], reader)]
        for name in from_runs:
            store.runs.get(name)  # an unknown run fails before any output is written
        from_run = from_runs[0]
        if len(from_runs) > 1 and replay:
            _replay_many(console, store, from_runs, consumer)
            return
        if replay:
            _replay(console, store, from_run, consumer, reader)
            return
        setup = TrainerSetup(
            from_run,
            consumer,
            out,
            n_samples_per_prompt or recorded_samples_per_prompt(store, from_run),
            backend,
            model,
            seed,
            initial_version,
        )
        options = step_options(cfg, setup)
        pusher = _pusher(store, setup, PushOptions(push_to, proxy_admin_url, push_every, push_keep))
        chosen = _slime_dump(setup) if backend == "slime-dump" else build_backend(cfg, setup, pusher)
        if len(from_runs) > 1:
            if follow or reader is not None:
                raise ConfigError("several --from-run train on finished logs: without --follow and a replica")
            if loggers:
                raise ConfigError("--log-to applies to one --from-run (its step metrics are in the log)")
            _train_many(console, store, from_runs, version_offsets, consumer, options, chosen, max_steps)
        else:
            if not follow and not _has_work(console, store, from_run, consumer, options, reader):
                return
            _train(
                console,
                store,
                from_run,
                consumer,
                options,
                chosen,
                (follow, max_steps, throttle_s),
                reader,
                _open_loggers(loggers, out, store.runs.get(from_run)),
            )
        prune = getattr(chosen, "prune_checkpoints", None)
        if prune is not None:
            prune(cfg.keep_checkpoints)
    except BaseException:
        if not out_existed:
            remove_if_empty(out)
        raise
    finally:
        if reader is not None:
            reader.close()
        store.close()


@dataclass(frozen=True)
class PushOptions:
    """``--push-to`` and its companions: where each new policy goes."""

    push_to: str | None
    proxy_admin_url: str | None
    every: int
    keep: int | None


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


def _has_work(
    console: Console,
    store: EventStore,
    run: str,
    consumer: str,
    options: StepOptions,
    reader: EventStore | None,
) -> bool:
    """Whether a new step can be formed now; if not, say why before any model is loaded.

    A run whose sessions all ended without one finishing is an error that counts them by status and
    gives the query showing why; a rerun with nothing new is not an error.
    """
    from dressage.errors import TrainingError
    from dressage.training.consumer import Trainer

    trainer = Trainer(store, run, options, consumer=consumer, reader=reader)
    if trainer.has_new_step():
        return True
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


def _train(
    console: Console,
    store: EventStore,
    run: str,
    consumer: str,
    options: StepOptions,
    backend: Backend,
    pace: tuple[bool, int | None, float],
    reader: EventStore | None = None,
    loggers: Loggers | None = None,
) -> None:
    from rich.markup import escape

    from dressage.training.consumer import StepResult, Trainer, manifest_summary
    from dressage.training.loggers import Loggers, version_rewards

    follow, max_steps, throttle_s = pace
    loggers = loggers or Loggers()
    trainer = Trainer(store, run, options, backend, consumer=consumer, reader=reader)
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
            loggers.step(result.batch.step, result.metrics)

        try:
            results = trainer.run_steps(
                follow=follow, max_steps=max_steps, throttle_s=throttle_s, on_step=stepped
            )
            loggers.versions(version_rewards(store, run))  # training and eval reward per version
        finally:
            loggers.close()
    console.print(f"{len(results)} new steps committed for {trainer.consumer}", markup=False)
    _report_evals(console, store, run)
    pattern = getattr(backend, "pattern", None)
    if pattern is not None:
        from dressage.integrations.slime import slime_command, slime_rollout_command

        total = len(store.consumers.steps(run, trainer.consumer))
        console.print(slime_command(str(pattern), options, total), highlight=False, soft_wrap=True)
        console.print("or let slime ask the log for each step (launcher: docs/architecture.md):")
        console.print(slime_rollout_command(run, options), highlight=False, soft_wrap=True)


def _train_many(
    console: Console,
    store: EventStore,
    runs: list[str],
    offsets: list[int] | None,
    consumer: str,
    options: StepOptions,
    backend: Backend,
    max_steps: int | None,
) -> None:
    from dressage.training.multirun import MultiRunTrainer

    trainer = MultiRunTrainer(store, runs, options, backend, consumer=consumer, version_offsets=offsets)
    for batch in trainer.run_steps(max_steps=max_steps):
        origins = sorted({e["run"] for e in batch.manifest["samples"]})
        console.print(
            f"step {batch.step} {batch.batch_hash} ({len(batch.samples)} samples from {', '.join(origins)})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    total = len(store.consumers.steps(runs[0], trainer.consumer))
    console.print(f"{total} steps recorded for {trainer.consumer} in run {runs[0]!r}", markup=False)


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
