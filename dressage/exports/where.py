"""``--where``: choose sessions by a SQL predicate over the ``trajectories`` view.

The predicate is checked to be one expression (balanced parentheses outside quotes, no ``;``, no
comments), placed inside a sub-select so it cannot widen the run filter around it, and run by
:func:`~dressage.store.read_only_sql.run_read_only`, where the database refuses writes (the check
is for a clear message and the run filter, not what keeps the log unchanged).
A predicate the database rejects comes back as one line naming ``--where``.
"""

from __future__ import annotations

from dressage.errors import InvalidRecordError, StoreError
from dressage.store.database import Database
from dressage.store.read_only_sql import run_read_only

MAX_SESSIONS = 10_000_000


def check_predicate(predicate: str) -> str:
    """``predicate`` stripped, if it reads as one SQL expression; else :class:`InvalidRecordError`."""
    text = predicate.strip()
    if not text:
        raise InvalidRecordError(
            "--where is empty; give a predicate such as \"reward >= 1 AND kind = 'train'\""
        )
    depth, quote = 0, ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise InvalidRecordError(f"--where has an unmatched ')' at character {i + 1}")
        elif ch == ";":
            raise InvalidRecordError("--where must be one predicate, without ';'")
        elif text.startswith(("--", "/*"), i):
            raise InvalidRecordError("--where must not contain SQL comments")
    if quote:
        raise InvalidRecordError("--where has an unterminated quoted string")
    if depth:
        raise InvalidRecordError("--where has an unmatched '('")
    return text


def select_sessions(db: Database, run: str, predicate: str) -> set[str]:
    """Ids of the sessions of ``run`` whose ``trajectories`` row satisfies ``predicate``."""
    text = check_predicate(predicate)
    quoted = run.replace("'", "''")
    query = (
        f"SELECT w.session_id FROM (SELECT * FROM trajectories WHERE {text}) w WHERE w.run_name = '{quoted}'"
    )
    try:
        _, rows, _ = run_read_only(db, query, limit=MAX_SESSIONS)
    except (StoreError, InvalidRecordError) as e:
        raise InvalidRecordError(f"--where {text!r} was refused: {e}") from e
    return {str(row[0]) for row in rows}
