"""``dressage-worker view``: the web viewer over the log, and ``view bundle`` (a static copy).

The viewer binds to 127.0.0.1 by default. Listening on any other address needs a token (given with
``--token`` or ``DRESSAGE_VIEW_TOKEN``, or generated and printed once); every database access is
read-only and the schema is never migrated.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dressage.cli import render
from dressage.commandline import DatabaseUrl, handle_errors
from dressage.config import load_settings

view_app = typer.Typer(
    help="The web viewer over the log (runs, sessions, tokens, groups, training steps).",
    invoke_without_command=True,
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@view_app.callback()
@handle_errors
def view(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; beyond loopback a token is required.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 7680,
    token: Annotated[
        str | None,
        typer.Option(
            help="Token the browser must present (default: DRESSAGE_VIEW_TOKEN, else generated).",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    replica_url: Annotated[
        str | None,
        typer.Option(
            help="Read from this PostgreSQL streaming replica instead (default: DRESSAGE_REPLICA_URL).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the viewer at http://HOST:PORT (read-only)."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from dressage.view.app import create_app
    from dressage.view.readonly import open_readonly_store
    from dressage.view.server import ViewServer

    settings = load_settings(database_url=database_url, replica_url=replica_url)
    store = open_readonly_store(settings, replica=True)
    if token is None and settings.view_token is not None:
        token = settings.view_token.get_secret_value()
    if token is None and not _is_loopback(host):
        token = secrets.token_urlsafe(24)
    if token is not None and len(token) < 16:
        raise typer.BadParameter("the token must have at least 16 characters", param_hint="--token")
    app = create_app(store, token=token)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    render.console(stderr=True).print(f"Dressage viewer on [bold]{url}[/] (read-only; Ctrl-C stops it)")
    try:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        ViewServer(config, app.state.live).run()
    finally:
        store.close()


@view_app.command("bundle")
@handle_errors
def bundle(
    run: Annotated[str, typer.Argument(help="The run to copy.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to create (absent or empty).")],
    session: Annotated[
        list[str] | None, typer.Option("--session", help="Only these sessions (repeat the option).")
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Write a static copy of RUN (or of chosen sessions) that opens from disk with no server."""
    from dressage.view.bundle import write_bundle
    from dressage.view.decode import default_decoder
    from dressage.view.pages import Viewer
    from dressage.view.readonly import open_readonly_store

    store = open_readonly_store(load_settings(database_url=database_url))
    try:
        with Progress(TextColumn("bundle"), BarColumn(), MofNCompleteColumn(), transient=True) as bar:
            task = bar.add_task("pages", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            n = write_bundle(
                Viewer(store, default_decoder()), run, out, session_ids=session, progress=advance
            )
    finally:
        store.close()
    render.console().print(f"wrote {n} pages of run {run!r} to {out}: open {out / 'index.html'}")


def register(app: typer.Typer) -> None:
    """Add ``view`` (and ``view bundle``) to ``app``."""
    app.add_typer(view_app, name="view")
