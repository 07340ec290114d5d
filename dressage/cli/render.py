"""Rich helpers for the command line: consoles, tables, error lines and coloured token streams.

Consoles are built per call (not at import) so they write to whatever ``sys.stdout`` is at that
moment (the test runner swaps it) and pick up ``COLUMNS``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from dressage.commandline import console, print_error

if TYPE_CHECKING:  # the store and numpy are imported where a token stream is drawn, not at the CLI's start
    import numpy as np

    from dressage.paddock.workspace_diffs import TurnChanges
    from dressage.store.records import Turn

__all__ = [
    "cell",
    "console",
    "escape",
    "file_changes",
    "file_diffs",
    "legend",
    "print_error",
    "progress_bar",
    "table",
    "timestamp",
    "token_stream",
]


def cell(value: Any, digits: int = 4) -> str:
    """A table cell: ``-`` for None, floats rounded, containers as compact JSON-like text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float | Decimal):
        return f"{float(value):.{digits}g}" if math.isfinite(float(value)) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    return str(value)


def timestamp(ts: float | None) -> str:
    """A UNIX time as local ``YYYY-MM-DD HH:MM:SS``."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> Table:
    """A plain table whose cells fold instead of being cut off."""
    tab = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        tab.add_column(name, overflow="fold")
    for row in rows:
        tab.add_row(*(cell(v) for v in row))
    return tab


def logprob_style(logprob: float) -> str:
    """An RGB colour from green (probability 1) through yellow to red (probability 0)."""
    p = min(1.0, max(0.0, math.exp(logprob))) if math.isfinite(logprob) else 0.0
    red = int(255 * min(1.0, 2 * (1 - p)))
    green = int(255 * min(1.0, 2 * p))
    return f"rgb({red},{green},0)"


def _pieces(ids: np.ndarray, decode: Callable[[list[int]], str] | None) -> list[tuple[int, int, str]]:
    """Split ``ids`` into (start, end, text) pieces; several ids join when one alone is partial UTF-8."""
    if decode is None:
        return [(i, i + 1, f"[{int(x)}]") for i, x in enumerate(ids)]
    out: list[tuple[int, int, str]] = []
    i = 0
    while i < len(ids):
        j = i + 1
        text = decode([int(ids[i])])
        while "\ufffd" in text and j < len(ids) and j - i < 4:
            j += 1
            text = decode([int(x) for x in ids[i:j]])
        out.append((i, j, text))
        i = j
    return out


def token_stream(turns: Sequence[Turn], decode: Callable[[list[int]], str] | None) -> Text:
    """The turns' tokens in order: context dim, generated coloured by logprob, untrained italic.

    ``decode`` turns ids into text; without it each token shows as ``[id]``.
    """
    import numpy as np

    out = Text()
    for turn in turns:
        out.append(f"\n── turn {turn.turn_index} (segment {turn.segment_index}) ──\n", style="bold cyan")
        for start, end, text in _pieces(turn.context_ids, decode):
            del start, end
            out.append(text, style="dim")
        for start, end, text in _pieces(turn.generated_ids, decode):
            lp = float(np.min(turn.logprobs[start:end]))
            trained = bool(np.all(turn.loss_mask[start:end]))
            out.append(text, style=logprob_style(lp) + ("" if trained else " italic"))
    return out


def legend() -> Text:
    """The key to :func:`token_stream`'s colours."""
    return Text.assemble(
        ("context", "dim"),
        "  generated: ",
        ("p≈1", logprob_style(0.0)),
        " → ",
        ("p≈0.5", logprob_style(math.log(0.5))),
        " → ",
        ("p≈0", logprob_style(-20.0)),
        "  ",
        ("not trained (loss_mask 0)", "italic"),
    )


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr; yields ``advance(done, total)`` for the worker to call."""
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=None)

    def advance(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield advance


_CHANGE_STYLES = {"added": "green", "modified": "yellow", "removed": "red"}


def file_changes(turns: Sequence[TurnChanges], scrub: Callable[[str], str]) -> Table:
    """One row per changed path of each checkpoint turn (paths are the agent's: plain text, no
    markup; ``scrub`` redacts one)."""
    tab = Table(title=f"{len(turns)} checkpoint(s)", title_justify="left", header_style="bold")
    for name in ("turn", "change", "path", "kind", "size"):
        tab.add_column(name, overflow="fold")
    for tc in turns:
        if not tc.files:
            tab.add_row(str(tc.turn_index), Text("(no file changed)", style="dim"), "", "", "")
        for f in tc.files:
            style = _CHANGE_STYLES.get(f.change, "")
            tab.add_row(
                str(tc.turn_index),
                Text(f.change, style=style),
                Text(scrub(f.path)),
                cell(f.kind),
                cell(f.size),
            )
    return tab


def file_diffs(turn: TurnChanges, scrub: Callable[[str], str]) -> list[Text]:
    """Each changed path of ``turn`` with its unified diff or its note; ``scrub`` redacts a line.
    Contents are the agent's: :class:`~rich.text.Text`, never markup."""
    out: list[Text] = []
    for f in turn.files:
        head = Text.assemble((f"{f.change:>8} ", _CHANGE_STYLES.get(f.change, "")), (scrub(f.path), "bold"))
        if f.note:
            head.append(f"  ({scrub(f.note)})", style="dim")
        out.append(head)
        for line in f.diff or []:
            style = "bold" if line.startswith(("+++", "---")) else _DIFF_STYLES.get(line[:1], "")
            out.append(Text(scrub(line), style=style))
    return out


_DIFF_STYLES = {"+": "green", "-": "red", "@": "cyan"}
