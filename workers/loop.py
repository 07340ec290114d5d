"""``dressage-worker loop``: rollout, train and push weights for K iterations in one process.

See :mod:`dressage.loop.runner` for the schedule (sync or async). Prints a table per iteration
(policy version, sessions, mean reward), the plain numbers, and writes a plot of the mean reward.
Heavy imports (torch, the proxy, matplotlib) happen inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dressage.commandline import DatabaseUrl, handle_errors
from dressage.commandline import console as make_console
from dressage.errors import Interrupted

if TYPE_CHECKING:
    from rich.console import Console

    from dressage.loop.runner import LoopReport

_Resume = Annotated[
    str | None,
    typer.Option(
        "--resume",
        help="Continue the interrupted loop RUN from its last committed step and pushed version "
        "(its frozen config; --iterations sets the total to reach).",
    ),
]

_Ray = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        help="Play each iteration's rollout on Ray worker actors: auto, HOST:PORT, or local "
        "(start one here); the loop's proxy must be reachable from the nodes (docs/scale.md).",
    ),
]


@handle_errors
def loop_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Run config (YAML) with train:/loop: sections.")
    ] = None,
    resume: _Resume = None,
    iterations: Annotated[
        int | None, typer.Option("--iterations", "-k", help="Iterations (default: loop.iterations).")
    ] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="sync | async (default: loop.mode).")] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Name of the new run (default: <config run>-<mode>).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Checkpoints and pushed weights (default: <home>/loop/<run>)."),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write the mean-reward curve here (PNG).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", "-j", help="Episodes at once (overrides worker.concurrency)."),
    ] = None,
    database_url: DatabaseUrl = None,
    replica_url: Annotated[
        str | None,
        typer.Option(
            "--replica-url",
            help="The trainer reads groups and turns from this PostgreSQL streaming replica "
            "(default: DRESSAGE_REPLICA_URL); everything is written to the primary.",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
    log_to: Annotated[
        str | None,
        typer.Option(
            "--log-to",
            help="Also log step metrics and rewards to wandb,tensorboard (under --out; overrides train.log_to).",
        ),
    ] = None,
    ray_address: _Ray = None,
) -> None:
    """Alternate rollout and training on the CPU (or SGLang engines) and show the reward curve."""
    import asyncio

    from dressage.config import load_settings
    from dressage.interrupts import graceful_stop
    from dressage.loop.runner import LoopOptions, run_loop
    from dressage.training.loggers import parse_log_to

    if ray_address is not None:  # Ray missing: say how to install it before anything starts
        from dressage.cluster import ray_rollout_module

        ray_rollout_module()
    stop = graceful_stop()
    settings = load_settings(database_url=database_url, replica_url=replica_url)
    opts = LoopOptions(
        config_path=str(config) if config is not None else None,
        iterations=iterations,
        mode=mode,
        run=run,
        out_dir=out,
        concurrency=concurrency,
        show_progress=progress,
        ray_address=ray_address,
        log_to=parse_log_to(log_to) if log_to is not None else None,
        resume=resume,
    )
    console = make_console(stderr=True)
    report = asyncio.run(run_loop(settings, opts, console, stop))
    db = "" if database_url is None else f" --database-url {settings.resolved_database_url()}"
    if report.interrupted is not None:
        ray = "" if ray_address is None else f" --ray {ray_address}"
        _stopped(console, report, f"{db}{ray}", stop.exit_code)
    _print_report(console, report, plot, db)


def _stopped(console: Console, report: LoopReport, options: str, exit_code: int) -> None:
    """The iterations played so far, then :class:`Interrupted` with the command that goes on."""
    from dressage.loop.report import summary_table

    console.print(summary_table(report.iterations, title=f"run {report.run} ({report.mode}, interrupted)"))
    raise Interrupted(f"resume with dressage-worker loop --resume {report.run}{options}", exit_code)


def _print_report(console: Console, report: LoopReport, plot: Path | None, db: str) -> None:
    """The iteration table, the reward (and eval) line, the plot, and the replay command."""
    from dressage.loop.report import reward_line, summary_table, write_plot
    from dressage.rollout.evaluation import eval_line

    title = f"run {report.run} ({report.mode}, {len(report.iterations)} iterations, {report.seconds:.0f}s)"
    console.print(summary_table(report.iterations, title=title))
    typer.echo(reward_line(report.iterations))
    if report.evals:
        typer.echo(eval_line(report.evals, report.eval_name))
    if plot is not None:
        write_plot(
            report.iterations,
            plot,
            title=f"dressage-worker loop: {title}",
            evals=report.evals,
            eval_name=report.eval_name,
        )
        console.print(f"mean-reward curve written to {plot}", soft_wrap=True)
    console.print(
        f"check every training step against the log with:\n"
        f"  dressage-worker train --from-run {report.run} --consumer loop --replay{db}",
        soft_wrap=True,
    )
