"""The command line's shared conventions, below both :mod:`dressage.cli` and :mod:`workers`.

One error handler (:func:`handle_errors`) and its exit codes, the ``--database-url`` option every
command takes (:data:`DatabaseUrl`), and the consoles commands print on (:func:`console`,
:func:`print_error`). See "The command line's conventions" in docs/architecture.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from dressage.errors import DressageError, Interrupted, VerificationError
from dressage.interrupts import signal_handlers_restored

P = ParamSpec("P")
R = TypeVar("R")

EXIT_ERROR = 1
"""Exit code of a command that failed with an error Dressage reports (config, input, store, engine)."""
EXIT_USAGE = 2
"""Exit code of a command-line usage error (unknown option, value of the wrong type): click's own."""
EXIT_MISMATCH = 3
"""Exit code of a check that found a mismatch (``train --replay`` drift, ``verify-export``)."""

EXIT_INTERRUPTED = 130
"""Exit code of a command stopped by SIGINT (143: by SIGTERM or a ``dressage-worker stop`` request)."""

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="SQLAlchemy URL of the event log (overrides DRESSAGE_DATABASE_URL; default: ./.dressage/dressage.db).",
        show_default=False,
    ),
]
"""The ``--database-url`` option of every command that opens the log."""


PIPE_WIDTH = 4096
"""Width of a console that is not a terminal: wide enough that no table cell (a 32-character id, a
column header) and no printed command is wrapped or cut, so what is piped or logged copies whole."""


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr); when it is not a terminal, :data:`PIPE_WIDTH` wide so that
    tables keep their natural width and lines are never folded (machine-copyable output).

    Built per call (not at import) so it writes to whatever ``sys.stdout`` is at that moment (the test
    runner swaps it). Emoji codes are off: user text such as the consumer name ``train:loop:`` must
    print as written.
    """
    c = Console(stderr=stderr, highlight=False, soft_wrap=False, emoji=False)
    if not c.is_terminal:
        c.width = max(c.width, PIPE_WIDTH)
    return c


def print_error(message: str) -> None:
    """``error: <first line>`` in red on stderr; further lines of the message follow, indented."""
    first, *rest = message.splitlines() or [""]
    out = console(stderr=True)
    out.print(Text.assemble(("error: ", "bold red"), (first, "red")), soft_wrap=True)
    for line in rest:
        out.print(Text("  " + line), soft_wrap=True)


def print_interrupted(message: str) -> None:
    """``interrupted: <message>`` in yellow on stderr, one line (how to resume)."""
    out = console(stderr=True)
    out.print(Text.assemble(("interrupted: ", "bold yellow"), (message, "yellow")), soft_wrap=True)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a command with the CLI's error convention (see ``docs/architecture.md``, exit codes).

    A :class:`DressageError` prints ``error: <message>`` on stderr (the whole message: errors are
    one line by convention, any further lines are printed indented under it) and exits with
    :data:`EXIT_ERROR`, or :data:`EXIT_MISMATCH` for a :class:`VerificationError`. A command stopped
    gracefully (:class:`Interrupted`) prints ``interrupted: <how to resume>`` and exits with its code
    (130 for SIGINT, 143 for SIGTERM); a forced stop (a second signal) exits 130 the same way.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with signal_handlers_restored():
                return fn(*args, **kwargs)
        except Interrupted as e:
            print_interrupted(str(e))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print_interrupted("stopped at once (a second signal, or Ctrl-C outside a graceful stop)")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except DressageError as e:
            print_error(str(e) or type(e).__name__)
            raise typer.Exit(EXIT_MISMATCH if isinstance(e, VerificationError) else EXIT_ERROR) from None

    return wrapper
