"""``dressage-worker fork``: new branches of a recorded session from one of its turns.

Heavy imports (the proxy, torch via the engine, openai) happen inside the command, so the CLI
starts fast for other sub-commands.
"""

from __future__ import annotations

from typing import Annotated

import typer

from dressage.commandline import DatabaseUrl, handle_errors
from dressage.commandline import console as make_console
from dressage.errors import AgentError, Interrupted


@handle_errors
def fork_command(
    session: Annotated[str, typer.Argument(help="The recorded session to fork (its id).")],
    at_turn: Annotated[
        int,
        typer.Option(
            "--at-turn",
            help="K: each branch starts with the session's turns 0..K-1 (copied), then goes live.",
        ),
    ],
    branches: Annotated[
        int, typer.Option("--branches", "-n", help="How many branches (child sessions).")
    ] = 1,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Branch i samples with seed S + i (default: the parent's seed + 1 + i)."),
    ] = None,
    into: Annotated[
        str | None,
        typer.Option("--into", help="Record the branches in run RUN (default: the session's own run)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue the branches of this fork an earlier, interrupted command left."
        ),
    ] = False,
    from_checkpoint: Annotated[
        bool,
        typer.Option(
            "--from-checkpoint/--replay",
            help="Start each branch from the session's sandbox checkpoint at turn K when it has one and "
            "the agent can resume (the default), or replay turns 0..K-1 (the agent re-runs its tools).",
        ),
    ] = True,
    database_url: DatabaseUrl = None,
) -> None:
    """Fork SESSION at turn K into N branches (docs/rollout.md, "Forks")."""
    import asyncio

    from rich.markup import escape

    from dressage.config import load_settings
    from dressage.interrupts import graceful_stop
    from dressage.rollout.fork import ForkSpec
    from dressage.rollout.fork_command import fork_session

    stop = graceful_stop()
    settings = load_settings(database_url=database_url)
    spec = ForkSpec(session, at_turn, branches, seed, into, resume, from_checkpoint)
    console = make_console(stderr=True)
    report = asyncio.run(fork_session(settings, spec, console, stop))
    if report.interrupted is not None:
        again = f"{session} --at-turn {at_turn} --branches {branches}"
        again += "".join(f" {k} {v}" for k, v in (("--seed", seed), ("--into", into)) if v is not None)
        again += "" if from_checkpoint else " --replay"
        db = "" if database_url is None else f" --database-url {settings.resolved_database_url()}"
        raise Interrupted(f"resume with dressage-worker fork {again} --resume{db}", stop.exit_code)
    for sid, out in report.outcomes.items():
        reward = "" if out.reward is None else f" reward {out.reward:g}"
        error = f": {escape(out.error)}" if out.error and out.status != "finished" else ""
        console.print(f"{sid} {out.status}{reward}{error}", soft_wrap=True, highlight=False)
    console.print(
        f"forked {escape(report.parent_session_id)} at turn {report.fork_turn} into run "
        f"{escape(report.run)}: {len(report.outcomes)} branches",
        soft_wrap=True,
    )
    if not any(o.status in ("finished", "ended") for o in report.outcomes.values()):
        raise AgentError(f"no branch of the fork of {session} finished")
