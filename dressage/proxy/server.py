"""``ProxyServer``: the TITO proxy as an object, served by uvicorn inside the running event loop.

Used in-process by the rollout worker and tests, and by ``dressage-worker proxy``. ``port=0``
picks an ephemeral port (``base_url`` tells which after :meth:`start`); ``uds_path`` adds a Unix
socket listener (same app) for sandboxes. The in-memory state is a cache of the log: a new
ProxyServer on the same store continues live sessions when their agents' requests arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping

import uvicorn

from dressage.config import Settings, load_settings
from dressage.errors import ConfigError
from dressage.proxy.app import create_app
from dressage.proxy.contract import ServedProxy
from dressage.proxy.keepalive import HttpToolsKeepAliveProtocol
from dressage.proxy.service import ProxyService
from dressage.store import EventStore


class EmbeddedUvicornServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the process embedding it (a rollout worker, the loop).

    uvicorn's own ``serve()`` takes over SIGINT/SIGTERM while it runs and re-raises them when it
    stops: inside a worker that would stop the proxy before the worker heard of the signal.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:
        """The same hook in older uvicorn versions: do nothing."""


log = logging.getLogger("dressage.proxy")


class ProxyServer(ProxyService):
    """The OpenAI-compatible, token-exact recording proxy (see :mod:`dressage.proxy`): the
    :class:`ProxyService` (so the same :class:`~dressage.proxy.contract.Proxy`), also listening."""

    def __init__(
        self,
        store: EventStore,
        engine_urls: list[str],
        *,
        settings: Settings | None = None,
        profile: str = "qwen3.5",
        host: str = "127.0.0.1",
        port: int = 0,
        uds_path: str | None = None,
        record_experts: bool = False,
        context_window: int | None = None,
        default_sampling: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(
            store,
            engine_urls,
            settings=settings or load_settings(),
            profile=profile,
            record_experts=record_experts,
            context_window=context_window,
            default_sampling=default_sampling,
        )
        self.host = host
        self.port = port
        self.uds_path = uds_path
        self.app = create_app(self)
        self._servers: list[EmbeddedUvicornServer] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (the real port once started)."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen on TCP (and the Unix socket if given) in the running loop."""
        if self._servers:
            raise ConfigError("this ProxyServer is already started")
        self.profile.tokenizer  # noqa: B018 - load the tokenizer before the first request
        sock = self._listen()
        configs: list[tuple[uvicorn.Config, list[socket.socket] | None]] = [(self._uvicorn_config(), [sock])]
        if self.uds_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.uds_path)
            configs.append((self._uvicorn_config(self.uds_path), None))
        for config, sockets in configs:
            server = EmbeddedUvicornServer(config)
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve(sockets=sockets)))
        while not all(s.started for s in self._servers):
            for task in self._tasks:
                if task.done():
                    task.result()  # raises why it could not start
                    raise ConfigError(f"the proxy could not listen on {self.base_url}")
            await asyncio.sleep(0.01)
        log.info("proxy listening on %s", self.base_url)

    def _listen(self) -> socket.socket:
        """The bound, listening TCP socket (its real port becomes :attr:`port`)."""
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
        # TCP, and without it every small response waits ~40 ms for a delayed ACK (Nagle).
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(self.settings.proxy_backlog)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._base_url = self.base_url
        return sock

    def _uvicorn_config(self, uds: str | None = None) -> uvicorn.Config:
        """uvicorn's config: quiet, httptools' C parser, and idle connections closed only when no
        request is arriving (:mod:`dressage.proxy.keepalive`)."""
        settings = self.settings
        return uvicorn.Config(
            self.app,
            uds=uds,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=HttpToolsKeepAliveProtocol,
            timeout_keep_alive=settings.proxy_keep_alive_s,  # type: ignore[arg-type]  # seconds; uvicorn takes a float too
            backlog=settings.proxy_backlog,
        )

    async def stop(self) -> None:
        """Stop listening and close engine connections (in-flight requests are cut)."""
        for server in self._servers:
            server.should_exit = True
            server.force_exit = True
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._servers.clear()
        self._tasks.clear()
        await self.aclose()

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _implements_contract(server: ProxyServer) -> ServedProxy:
    """mypy checks here that :class:`ProxyServer` (and so :class:`ProxyService`) is a served :class:`Proxy`."""
    return server
