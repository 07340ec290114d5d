"""Fixtures: real proxies, on the session's dev engine (``engine``, tests/conftest.py), served from an
event loop in a background thread.

The proxy runs in its own loop thread so the sync OpenAI client can call it from the test thread;
async-client tests run their own loop with ``asyncio.run``. Stores are real SQLite / PostgreSQL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import ENGINE_EXTRA, require_module

require_module("torch", ENGINE_EXTRA)

from dressage.config import Settings  # noqa: E402
from dressage.proxy import ProxyServer  # noqa: E402
from dressage.store import EventStore  # noqa: E402
from tests.dev_engine import RunningEngine  # noqa: E402
from tests.stores import open_store  # noqa: E402

T = TypeVar("T")
ADMIN = "admin-secret-token-123"


class LoopThread:
    """An asyncio loop running in a daemon thread; :meth:`call` runs a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class Harness:
    """A proxy on a store, started in the loop thread; ``restart`` replaces it by a fresh one."""

    def __init__(self, loop: LoopThread, store: EventStore, engine_url: str, **kwargs: Any) -> None:
        self.loop = loop
        self.store = store
        self.engine_url = engine_url
        self.kwargs = kwargs
        self.server = self._start()

    def _start(self) -> ProxyServer:
        settings = Settings(admin_token=ADMIN, max_request_bytes=256 * 1024, secrets=["sup3r-secret-value"])
        kwargs = {"context_window": 4096, **self.kwargs}
        server = ProxyServer(self.store, [self.engine_url], settings=settings, **kwargs)
        self.loop.call(server.start())
        return server

    def restart(self) -> None:
        self.loop.call(self.server.stop())
        self.server = self._start()

    def run(self, name: str | None = None) -> str:
        import uuid

        name = name or f"run-{uuid.uuid4().hex[:8]}"
        self.loop.call(self.server.create_run(name, {}))
        return name

    def session(self, run: str) -> Any:
        return self.loop.call(self.server.open_session(run, task_id=None, agent="test"))


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def sqlite_store(sqlite_url: str, tmp_path: Path) -> Iterator[EventStore]:
    with open_store(sqlite_url, tmp_path / "home") as s:
        yield s


def _harness(
    loop_thread: LoopThread, store: EventStore, engine: RunningEngine, **kw: Any
) -> Iterator[Harness]:
    h = Harness(loop_thread, store, engine.url, **kw)
    yield h
    loop_thread.call(h.server.stop())


@pytest.fixture
def proxy(loop_thread: LoopThread, sqlite_store: EventStore, engine: RunningEngine) -> Iterator[Harness]:
    """A proxy on SQLite."""
    yield from _harness(loop_thread, sqlite_store, engine)


@pytest.fixture
def proxy_any(loop_thread: LoopThread, store: EventStore, engine: RunningEngine) -> Iterator[Harness]:
    """A proxy on each backend in turn (SQLite, PostgreSQL), recording routed experts."""
    yield from _harness(loop_thread, store, engine, record_experts=True)
