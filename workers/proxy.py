"""``dressage-worker proxy``: run the TITO proxy standalone in front of one or more engines.

Heavy imports (uvicorn, the store, the tokenizer) happen inside the command so the CLI starts fast.
"""

from __future__ import annotations

import typer

from dressage.commandline import handle_errors
from dressage.errors import ConfigError


@handle_errors
def proxy_command(
    engine_url: list[str] = typer.Option(..., "--engine-url", help="Engine base URL (repeat for several)."),
    port: int = typer.Option(8000, help="TCP port to listen on (0: pick a free one)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    database_url: str | None = typer.Option(
        None, help="Event log URL (default: DRESSAGE_DATABASE_URL or SQLite)."
    ),
    admin_token: str | None = typer.Option(
        None, help="Bearer token of the admin API (default: DRESSAGE_ADMIN_TOKEN; none disables it)."
    ),
    profile: str = typer.Option(
        "qwen3.5",
        "--profile",
        "--model-profile",
        help="TITO model profile: qwen3.5, qwen3.5-nothink, qwen3.6, qwen3.6-preserve, deepseek-v3, mistral-nemo.",
    ),
    uds: str | None = typer.Option(None, help="Also listen on this Unix socket."),
    record_experts: bool = typer.Option(False, help="Record MoE routed experts per token."),
    context_window: int | None = typer.Option(
        None, help="Context window (default: engine's, else profile's)."
    ),
    log_level: str = typer.Option("info", help="Log level of the proxy."),
) -> None:
    """Serve the OpenAI-compatible recording proxy until interrupted."""
    import asyncio
    import logging

    from dressage.config import load_settings
    from dressage.proxy import ProxyServer
    from dressage.proxy.eventloop import run
    from dressage.redact import install_log_redaction
    from dressage.store import EventStore
    from dressage.tito.profiles import profile_names

    if profile not in profile_names():  # before the log is opened (and created, and migrated)
        raise ConfigError(
            f"unknown model profile {profile!r} (--profile); known: {', '.join(profile_names())}"
        )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pydantic import SecretStr

    settings = load_settings(
        database_url=database_url, admin_token=SecretStr(admin_token) if admin_token else None
    )
    secrets = [s.get_secret_value() for s in settings.secrets]
    if settings.admin_token:
        secrets.append(settings.admin_token.get_secret_value())
    install_log_redaction(secrets)  # every handler: httpx/httpcore debug records print headers
    store = EventStore.open(settings=settings)

    async def main() -> None:
        server = ProxyServer(
            store,
            engine_url,
            settings=settings,
            profile=profile,
            host=host,
            port=port,
            uds_path=uds,
            record_experts=record_experts,
            context_window=context_window,
        )
        await server.start()
        typer.echo(f"proxy: {server.base_url} (engines: {', '.join(engine_url)})", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    try:
        run(main())
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
