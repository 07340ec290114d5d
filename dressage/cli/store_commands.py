"""Store commands of ``dressage-worker``: schema migrations, inspection, SQL, export and drop.

:func:`register` adds ``db upgrade|downgrade|current|create-reader|drop-reader``, ``runs``, ``show``, ``sql``, ``export``,
``verify-export``, ``import``, ``archive`` and ``drop`` to the app. Every command takes ``--database-url`` (default:
``DRESSAGE_DATABASE_URL``, else the embedded SQLite file). Inspection commands never migrate the
schema: a database behind head gets a message telling to run ``dressage-worker db upgrade``.
:func:`~dressage.commandline.handle_errors` (one red line and the CLI's exit code) wraps each.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from dressage.cli import render
from dressage.commandline import DatabaseUrl, handle_errors
from dressage.config import Settings, load_settings, require_database_file
from dressage.errors import StoreError

if TYPE_CHECKING:
    from dressage.store import EventStore
    from dressage.store.records import Turn

# The store, the exports and numpy are imported by the commands that use them, not here: every
# ``dressage-worker`` process (the dev engine's too) imports this module, most of them for nothing.


def _settings(database_url: str | None) -> Settings:
    return load_settings(database_url=database_url)


def _open(database_url: str | None) -> EventStore:
    """Open the log without migrating it (inspection must not change the schema, nor create a
    database file where a path is mistyped)."""
    from dressage.store import EventStore

    settings = _settings(database_url)
    require_database_file(settings.resolved_database_url())
    return EventStore.open(settings=settings, auto_upgrade=False, pool_size=1)


# --- db -------------------------------------------------------------------------------------------

db_app = typer.Typer(help="Schema migrations and reader roles of the event log.", no_args_is_help=True)


@db_app.command("upgrade")
@handle_errors
def db_upgrade(
    revision: Annotated[str, typer.Option(help="Target alembic revision.")] = "head",
    database_url: DatabaseUrl = None,
) -> None:
    """Apply schema migrations up to REVISION (default: the newest)."""
    from dressage.store import db as dbm

    url = _settings(database_url).resolved_database_url()
    dbm.upgrade(url, revision)
    render.console().print(f"schema upgraded to {revision} ({dbm.head_revision()} is head)")


@db_app.command("downgrade")
@handle_errors
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision; 'base' removes every table.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revert schema migrations down to REVISION."""
    from dressage.store import db as dbm

    url = _settings(database_url).resolved_database_url()
    dbm.downgrade(url, revision)
    render.console().print(f"schema downgraded to {revision}")


@db_app.command("current")
@handle_errors
def db_current(database_url: DatabaseUrl = None) -> None:
    """Print the database's schema revision and the newest one."""
    from sqlalchemy.exc import SQLAlchemyError

    from dressage.store import db as dbm
    from dressage.store.read_only_sql import first_line

    url = _settings(database_url).resolved_database_url()
    engine = dbm.make_engine(url, pool_size=1)
    try:
        current = dbm.current_revision(engine)
    except SQLAlchemyError as e:
        raise StoreError(f"cannot read the schema revision: {first_line(e)}; is the database running?") from e
    finally:
        engine.dispose()
    head = dbm.head_revision()
    out = render.console()
    out.print(f"current: {current or 'none'}")
    out.print(f"head:    {head}")
    if current != head:
        out.print("[yellow]behind head: run `dressage-worker db upgrade`[/]")


@db_app.command("create-reader")
@handle_errors
def db_create_reader(
    name: Annotated[str, typer.Argument(help="Name of the new PostgreSQL role (lowercase, digits, '_').")],
    database_url: DatabaseUrl = None,
) -> None:
    """Create a PostgreSQL login with SELECT only on the log's tables and views; print its URL.

    The URL holds a new random password, printed once and stored nowhere by Dressage: hand it to
    an analyst or an agent for `sql --database-url URL` (docs/sql.md).
    """
    from dressage.store import db as dbm
    from dressage.store.reader_role import create_reader

    engine = dbm.make_engine(_settings(database_url).resolved_database_url(), pool_size=1)
    try:
        url = create_reader(engine, name)
    finally:
        engine.dispose()
    typer.echo(url)
    render.console(stderr=True).print(
        f"created reader role {name!r}: SELECT on the log's tables and views, sessions read-only; "
        "the password is in this URL only"
    )


@db_app.command("drop-reader")
@handle_errors
def db_drop_reader(
    name: Annotated[str, typer.Argument(help="A role made by `db create-reader`.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a reader role's grants and drop it (only roles `db create-reader` made)."""
    from dressage.store import db as dbm
    from dressage.store.reader_role import drop_reader

    engine = dbm.make_engine(_settings(database_url).resolved_database_url(), pool_size=1)
    try:
        drop_reader(engine, name)
    finally:
        engine.dispose()
    render.console().print(f"dropped reader role {name!r}")


# --- runs / show ----------------------------------------------------------------------------------


@handle_errors
def runs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """List runs with their sessions by status, turns, tokens, trained tokens and mean reward (of
    training sessions; runs with eval sessions get a second table of those and their mean reward)."""
    from dressage.store.records import SESSION_STATUSES

    store = _open(database_url)
    try:
        items = [(r, store.runs.summary(r)) for r in store.runs.list()]
    finally:
        store.close()
    if as_json:
        records = [dataclasses.asdict(s) | {"created_at": r.created_at} for r, s in items]
        typer.echo(json.dumps(records, indent=2, sort_keys=True))
        return
    columns = ["run", "created", *SESSION_STATUSES, "turns", "tokens", "trained", "mean reward", "position"]
    rows = [
        [
            r.name,
            render.timestamp(r.created_at),
            *(s.sessions.get(status, 0) for status in SESSION_STATUSES),
            s.turns,
            s.tokens,
            s.trained_tokens,
            s.mean_reward,
            s.last_position,
        ]
        for r, s in items
    ]
    render.console().print(render.table(columns, rows, title=f"{len(rows)} run(s)"))
    evals = [
        [r.name, *(s.eval_sessions.get(x, 0) for x in SESSION_STATUSES), s.eval_mean_reward]
        for r, s in items
        if s.eval_sessions
    ]
    if evals:  # eval sessions apart: never trained, so not in the training counts' mean
        render.console().print(
            render.table(
                ["run", *SESSION_STATUSES, "eval reward"], evals, title="eval sessions (not trained)"
            )
        )


def _segments(turns: list[Turn]) -> list[list[Any]]:
    """One row per segment: threads, turns, tokens, trained tokens and the boundary that opened it."""
    by_segment: dict[int, list[Turn]] = {}
    for turn in turns:
        by_segment.setdefault(turn.segment_index, []).append(turn)
    rows = []
    for index, group in sorted(by_segment.items()):
        first = min(group, key=lambda x: x.turn_index)
        rows.append(
            [
                index,
                ",".join(str(x) for x in sorted({x.thread_index for x in group})),
                f"{first.turn_index}-{max(x.turn_index for x in group)}",
                sum(x.context_ids.size + x.generated_ids.size for x in group),
                sum(int(x.loss_mask.sum()) for x in group),
                first.boundary_reason,
            ]
        )
    return rows


def _decoder(run_config: dict[str, Any]) -> Callable[[list[int]], str] | None:
    """``decode`` of the model profile the run recorded (Qwen3.5 for runs without a record) when
    available, else None (ids are shown, and a note on stderr says why, so the fallback is never
    silent)."""
    from dressage.tito.profiles import RUN_RECORD_KEY, build_profile

    recorded = run_config.get(RUN_RECORD_KEY)
    name = str(recorded.get("model_profile")) if isinstance(recorded, dict) else "qwen3.5"
    try:
        return build_profile(name).tokenizer.decode
    except Exception as e:  # optional: any failure (missing package, no cache dir) falls back to ids
        reason = (str(e).splitlines() or [""])[0]
        render.console(stderr=True).print(
            f"note: showing token ids, not text: the {name} tokenizer could not be loaded "
            f"({type(e).__name__}: {reason})",
            markup=False,
            style="yellow",
        )
        return None


@handle_errors
def show(
    session_id: Annotated[str, typer.Argument(help="The session (trajectory) id.")],
    tokens: Annotated[bool, typer.Option("--tokens", help="Print the token stream, coloured.")] = False,
    limit: Annotated[int, typer.Option(help="Show at most this many turns.", min=1)] = 200,
    ids: Annotated[bool, typer.Option("--ids", help="With --tokens: show ids, do not decode.")] = False,
    files: Annotated[
        bool,
        typer.Option(
            "--files", help="The files each turn's sandbox checkpoint changed, in place of the turns."
        ),
    ] = False,
    turn: Annotated[
        int | None,
        typer.Option("--turn", help="With --files: only this turn's changes, with their diffs.", min=0),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Show one session: header, turns, segments and (with --tokens) its tokens; with --files, what
    each turn's sandbox checkpoint changed (with --turn K: turn K's changes and diffs)."""
    if turn is not None and not files:
        raise typer.BadParameter("--turn needs --files", param_hint="--turn")
    store = _open(database_url)
    try:
        session = store.sessions.get(session_id)
        run = store.runs.by_id(session.run_id)
        turns = store.turns.read(session_id=session_id, with_experts=False)
        kinds = store.events.count_by_kind(run, session_id)
        task_kind = store.tasks.kind_of(session.task_id) if session.task_id is not None else ("train", None)
        changes = _file_changes(store, session_id, turn) if files else None
    finally:
        store.close()
    out = render.console()
    header = [
        ("session", session.id),
        ("run", run.name),
        ("status", session.status),
        ("reward", render.cell(session.reward)),
        ("finish reason", render.cell(session.finish_reason)),
        ("attempt", session.attempt),
        ("task id", render.cell(session.task_id)),
        ("kind", task_kind[0] if task_kind[1] is None else f"eval of policy version {task_kind[1]}"),
        ("agent", render.cell(session.agent)),
        ("created", render.timestamp(session.created_at)),
        ("finished", render.timestamp(session.finished_at)),
        ("events", ", ".join(f"{k} {v}" for k, v in kinds.items())),
    ]
    if session.error:
        header.append(("error", session.error.splitlines()[0]))
    for key, value in header:
        out.print(f"[bold]{key:>13}[/]  {render.escape(str(value))}")
    if changes is not None:
        for part in changes:
            out.print(part)
        return
    shown = turns[:limit]
    rows = [
        [
            x.turn_index,
            x.thread_index,
            x.route,
            x.segment_index,
            x.boundary_reason,
            x.context_ids.size,
            x.generated_ids.size,
            int(x.loss_mask.sum()),
            x.finish_reason,
            _versions(x),
            None if x.latency_ms is None else round(x.latency_ms, 1),
        ]
        for x in shown
    ]
    columns = ["turn", "thread", "route", "segment", "boundary", "n ctx", "n gen", "trained"]
    columns += ["finish", "policy versions", "latency ms"]
    title = f"{len(turns)} turn(s)" + (f", first {limit} shown" if len(turns) > limit else "")
    out.print(render.table(columns, rows, title=title))
    seg_columns = ["segment", "threads", "turns", "tokens", "trained", "boundary reason"]
    out.print(render.table(seg_columns, _segments(turns), title="segments"))
    if tokens:
        out.print(render.legend())
        out.print(render.token_stream(shown, None if ids else _decoder(run.config)))


def _file_changes(store: EventStore, session_id: str, turn: int | None) -> list[Table | Text]:
    """``show --files``: every checkpoint's change list, or (``turn``) one turn's changes with diffs."""
    from dressage.paddock.workspace_diffs import session_changes, turn_diffs
    from dressage.redact import redact

    secrets = store.db.secrets

    def scrub(line: str) -> str:
        return redact(line, secrets) or ""

    if turn is None:
        return [render.file_changes(session_changes(store, session_id), scrub)]
    found = turn_diffs(store, session_id, turn)
    if found is None:
        held = [c.turn_index for c in store.sandbox_checkpoints.by_session(session_id)]
        raise typer.BadParameter(
            f"session {session_id} has no checkpoint at turn {turn} (turns with one: {held or 'none'})",
            param_hint="--turn",
        )
    counts = ", ".join(f"{v} {k}" for k, v in found.counts().items())
    title = Text(f"turn {turn}: {counts} (manifest {found.manifest_sha256[:12]})", style="bold")
    return [title, *render.file_diffs(found, scrub)]


def _versions(turn: Turn) -> str | None:
    import numpy as np

    if not turn.policy_versions.size:
        return None
    lo, hi = int(np.min(turn.policy_versions)), int(np.max(turn.policy_versions))
    return str(lo) if lo == hi else f"{lo}-{hi}"


# --- sql ------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


@handle_errors
def sql(
    query: Annotated[
        str | None,
        typer.Argument(
            help="One SQL statement (SELECT, WITH, EXPLAIN ...); '-' or none: read it from stdin."
        ),
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the query from a file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as a JSON list of objects.")] = False,
    limit: Annotated[int, typer.Option(help="Print at most this many rows.", min=1)] = 1000,
    database_url: DatabaseUrl = None,
) -> None:
    """Run one read-only SQL statement (views token_events, trajectories; see docs/sql.md).

    The database refuses writes: a read-only transaction that is rolled back (PostgreSQL, one
    statement over the extended protocol), a file opened read-only (SQLite).

    A query that starts with a ``--`` comment must come from stdin or ``--file`` (the shell
    would pass it as an option).
    """
    from dressage.store.read_only_sql import run_read_only

    if file is not None:
        try:
            query = file.read_text(encoding="utf-8")
        except OSError as e:
            raise StoreError(f"cannot read query file {file}: {e.strerror}") from e
    elif query is None or query == "-":
        query = sys.stdin.read()
    store = _open(database_url)
    try:
        columns, rows, truncated = run_read_only(store.db, query, limit=limit)
    finally:
        store.close()
    if as_json:
        objs = [{c: _jsonable(v) for c, v in zip(columns, row, strict=True)} for row in rows]
        typer.echo(json.dumps(objs, indent=2, default=str))
    else:
        title = f"{len(rows)} row(s)" + (f" (stopped at --limit {limit})" if truncated else "")
        render.console().print(render.table(columns, rows, title=title))
    if truncated:
        render.console(stderr=True).print(f"[yellow]more than {limit} rows; raise --limit to see all[/]")


# --- export / drop --------------------------------------------------------------------------------


@handle_errors
def export(
    run: Annotated[str, typer.Argument(help="Name of the run to export.")],
    to: Annotated[Path, typer.Option("--to", help="Directory to create (must be absent or empty).")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="parquet: turns, sessions, samples (+ the archive files); "
            "sft: sft.parquet, chat messages with tools beside the recorded ids (docs/export.md).",
        ),
    ] = "parquet",
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="SQL predicate over the trajectories view, e.g. \"reward >= 1 AND kind = 'train'\" "
            "(dataset files only; such an export cannot be imported).",
        ),
    ] = None,
    checkpoints: Annotated[
        bool,
        typer.Option(
            "--checkpoints",
            help="Also the sandbox checkpoints of the exported sessions: rows, manifests and file blobs "
            "(import brings them back).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Export a run as Parquet files with a hashed manifest (docs/export.md)."""
    from dressage.exports.export import EXPORT_FORMATS, export_run

    if fmt not in EXPORT_FORMATS:
        raise StoreError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    store = _open(database_url)
    try:
        with render.progress_bar("exporting sessions") as advance:
            manifest = export_run(
                store, run, to, where=where, fmt=fmt, progress=advance, checkpoints=checkpoints
            )
    finally:
        store.close()
    counts = ", ".join(f"{k} {v}" for k, v in manifest["counts"].items())
    render.console().print(f"exported run {run!r} to {to} ({len(manifest['files'])} files): {counts}")


@handle_errors
def verify(directory: Annotated[Path, typer.Argument(help="An export directory.")]) -> None:
    """Re-hash an export's files against its manifest."""
    from dressage.exports.verify import verify_export

    manifest = verify_export(directory)
    render.console().print(f"[green]ok[/]: {len(manifest['files'])} files of run {manifest['run']!r} match")


@handle_errors
def import_(
    directory: Annotated[Path, typer.Argument(help="A whole-run export directory (verified first).")],
    as_run: Annotated[
        str | None, typer.Option("--as", help="Name of the run in this log (default: the exported name).")
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Load a whole-run export into this log (SQLite or PostgreSQL), positions and hashes intact."""
    from dressage.exports.importer import import_run
    from dressage.store import EventStore

    store = EventStore.open(settings=_settings(database_url), auto_upgrade=True)
    try:
        with render.progress_bar("importing turns") as advance:
            run = import_run(store, directory, as_run=as_run, progress=advance)
        summary = store.runs.summary(run)
    finally:
        store.close()
    render.console().print(
        f"imported run {run.name!r} from {directory}: {sum(summary.sessions.values())} sessions, "
        f"{summary.turns} turns, {summary.tokens} tokens, {summary.last_position} events"
    )


@handle_errors
def archive(
    run: Annotated[str, typer.Argument(help="Name of the run to archive.")],
    to: Annotated[Path, typer.Option("--to", help="Directory to create (must be absent or empty).")],
    database_url: DatabaseUrl = None,
) -> None:
    """Export a run, verify the export, then drop the run (stops at the first failure)."""
    from dressage.exports.archive import archive_run

    store = _open(database_url)
    try:
        with render.progress_bar("exporting sessions") as advance:
            manifest = archive_run(store, run, to, progress=advance)
    finally:
        store.close()
    counts = manifest["counts"]
    render.console().print(
        f"archived run {run!r} to {to} ({counts['sessions']} sessions, {counts['turns']} turns, "
        f"{counts['events']} events; verified) and dropped it from the log"
    )


@handle_errors
def drop(
    run: Annotated[str, typer.Argument(help="Name of the run to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Delete every row of a run (export it first; artifact blobs are kept)."""
    store = _open(database_url)
    try:
        summary = store.runs.summary(run)
        if not yes:
            n_sessions = sum(summary.sessions.values())
            question = (
                f"Drop run {run!r} ({n_sessions} sessions, {summary.turns} turns, "
                f"{summary.last_position} events)? This cannot be undone"
            )
            if not typer.confirm(question, default=False):
                raise StoreError(
                    f"run {run!r} was not dropped (not confirmed); pass --yes to skip the question"
                )
        store.runs.drop(run)
    finally:
        store.close()
    render.console().print(f"dropped run {run!r}")


def register(app: typer.Typer) -> None:
    """Add the store commands to ``app``."""
    app.add_typer(db_app, name="db")
    app.command("runs")(runs)
    app.command("show")(show)
    app.command("sql")(sql)
    app.command("export")(export)
    app.command("verify-export")(verify)
    app.command("import")(import_)
    app.command("archive")(archive)
    app.command("drop")(drop)
