"""``dressage-worker``: the command-line entry point.

This module only wires sub-commands; each lives in its own module (store inspection in
:mod:`dressage.cli.store_commands`, long-running processes in :mod:`workers`).
"""

from __future__ import annotations

import sys

import typer
import typer.rich_utils

from dressage import __version__
from dressage.cli import stop_command, store_commands, view_command
from dressage.config import help_width
from workers import engine as engine_worker
from workers import fork as fork_worker
from workers import loop as loop_worker
from workers import proxy as proxy_worker
from workers import rollout as rollout_worker
from workers import train as train_worker

app = typer.Typer(
    name="dressage-worker",
    help="Dressage: token-exact trajectory log, TITO proxy, rollout workers and replay trainer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dressage-worker {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Dressage: token-exact trajectory log, TITO proxy, rollout workers and replay trainer."""


store_commands.register(app)
view_command.register(app)
app.command("engine")(engine_worker.engine_command)
app.command("proxy")(proxy_worker.proxy_command)
app.command("rollout")(rollout_worker.rollout_command)
app.command("fork")(fork_worker.fork_command)
app.command("train")(train_worker.train_command)
app.command("loop")(loop_worker.loop_command)
app.command("stop")(stop_command.stop_command)


def main() -> None:
    """Console-script entry point."""
    width = help_width(sys.stdout.isatty())
    if width is not None:  # no terminal: help as wide as its option names need, not rich's 80 columns
        typer.rich_utils.MAX_WIDTH = width
    app()
