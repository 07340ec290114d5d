"""Serve an ASGI app on ``127.0.0.1:<free port>`` in a daemon thread, for test harness servers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import uvicorn


class ThreadedServer:
    """uvicorn in a thread: :meth:`start` returns once it listens, :meth:`stop` shuts it down."""

    def __init__(
        self,
        app: Any,
        *,
        server: Callable[[uvicorn.Config], uvicorn.Server] = uvicorn.Server,
        **config: Any,
    ) -> None:
        """``server`` makes the uvicorn server from its config (a subclass, e.g. the viewer's)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._server = server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **config)
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        """Start serving; raises when the server does not listen within ``timeout`` seconds."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"test server on {self.base} did not start within {timeout:.0f} s")
            time.sleep(0.02)

    def stop(self) -> bool:
        """Ask the server to exit and wait for its thread (at most 5 s); True once it has ended."""
        self._server.should_exit = True
        self._thread.join(timeout=5)
        return not self._thread.is_alive()


class ServedInThread:
    """A test harness server on a :class:`ThreadedServer` (``self._http``), served by ``running()``."""

    _http: ThreadedServer

    @contextmanager
    def running(self) -> Iterator[Self]:
        """Serve in a thread for the duration of the block."""
        self._http.start()
        try:
            yield self
        finally:
            self._http.stop()
