"""``dressage-worker rollout``: run agents on a task set and record every token in the log.

Heavy imports (the proxy, torch via the engine, openai) happen inside the command, so the CLI
starts fast for other sub-commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dressage.commandline import DatabaseUrl, handle_errors
from dressage.commandline import console as make_console
from dressage.errors import AgentError, ConfigError, Interrupted, NotSupportedError

if TYPE_CHECKING:
    from rich.console import Console

    from dressage.rollout.worker import RolloutReport


@handle_errors
def rollout_command(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Rollout config (YAML); see docs/rollout.md.")
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue run RUN from its frozen config snapshot.")
    ] = None,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed",
            help="With --resume: also retry pairs whose agent failed (pairs that failed on "
            "infrastructure, e.g. a dead engine, are retried without it).",
        ),
    ] = False,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", "-j", help="Episodes at once (overrides worker.concurrency)."),
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option("--worker-id", help="Lease owner name (default: <hostname>-<pid>).")
    ] = None,
    database_url: DatabaseUrl = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the workers (and proxies) as actors of a Ray cluster: auto, HOST:PORT, or local "
            "(start one here); placement from the config's ray: section (docs/scale.md).",
        ),
    ] = None,
) -> None:
    """Create (or --resume) a run and drive episodes until every (task, sample) is done."""
    import asyncio

    from dressage.config import load_settings
    from dressage.interrupts import graceful_stop
    from dressage.rollout.worker import WorkerOptions, run_rollout

    _check_retry_failed(retry_failed, resume, ray_address)
    stop = graceful_stop()
    settings = load_settings(database_url=database_url)
    opts = WorkerOptions(
        config_path=str(config) if config else None,
        resume=resume,
        retry_failed=retry_failed,
        concurrency=concurrency,
        worker_id=worker_id,
        show_progress=progress,
        print_summary=True,
    )
    console = make_console(stderr=True)
    if ray_address is not None:
        from dressage.cluster import ray_rollout_module

        run_ray = ray_rollout_module().run_ray_rollout
        report = asyncio.run(run_ray(settings, opts, ray_address, console, stop))
    else:
        report = asyncio.run(run_rollout(settings, opts, console, stop))
    url = settings.resolved_database_url()
    db = "" if database_url is None else f" --database-url {url}"
    if report.interrupted is not None:
        ray = "" if ray_address is None else f" --ray {ray_address}"
        raise Interrupted(
            f"resume with dressage-worker rollout --resume {report.run}{db}{ray}",
            stop.exit_code,
        )
    _closing_lines(console, report, db)


def _check_retry_failed(retry_failed: bool, resume: str | None, ray_address: str | None) -> None:
    """``--retry-failed`` goes with ``--resume`` and without ``--ray``: refused otherwise, in one line."""
    if retry_failed and resume is None:
        raise ConfigError("--retry-failed retries the failed pairs of a run: give it with --resume RUN")
    if retry_failed and ray_address is not None:
        raise NotSupportedError(
            "--retry-failed with --ray is not built yet; run `dressage-worker rollout --resume RUN "
            "--retry-failed` without --ray (pairs that failed on infrastructure are retried either way)"
        )


def _closing_lines(console: Console, report: RolloutReport, db: str) -> None:
    """What to look at next; a run none of whose sessions finished is an error (exit non-zero)."""
    from rich.markup import escape

    console.print(
        f"\nrun [bold]{escape(report.run)}[/] done. Look at it with:\n"
        f"  dressage-worker runs{db}\n"
        f"  dressage-worker show {report.example_session or '<session-id>'}{db} --tokens\n"
        f'  dressage-worker sql{db} "select status, count(*), avg(reward) from sessions group by status"',
        soft_wrap=True,
    )
    if report.all_failed():
        counts = ", ".join(f"{n} {status}" for status, n in sorted(report.outcomes.items()))
        raise AgentError(
            f"no session of run {report.run!r} finished ({counts}); the last error: "
            f"{report.last_error or 'none recorded'}"
        )
