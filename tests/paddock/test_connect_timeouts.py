"""Every network hop's connect is bounded: a peer that never answers fails over (or fails) in seconds.

The peer here is :func:`tests.unanswering.unanswering_address`: a loopback listener whose full accept
queue drops SYNs, as a host that is gone does. Before the bound, the sandbox's relay waited out the
kernel's SYN retries (about 2 minutes) on such a proxy before trying the next one. The bounds
asserted are loose on purpose (a loaded machine): far below those 2 minutes, not a timing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from dressage.config import Settings
from dressage.engines.http1 import ConnectionPool, TransportError
from dressage.paddock import serve_unix_socket_router
from dressage.rollout.proxy_ring import ProxyRing
from dressage.store.db import make_engine, with_connect_timeout
from tests.stores import open_store
from tests.unanswering import unanswering_address

BOUND_S = 30.0
"""Far below the ~130 s of the kernel's SYN retries; each hop's timeout here is 1-2 s."""
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlive"


@asynccontextmanager
async def live_proxy() -> AsyncIterator[tuple[str, int]]:
    """A loopback HTTP server that answers every request with ``live``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(REPLY)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[:2]


async def _ask(socket_path: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(socket_path)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    reply = await reader.read()
    writer.close()
    return reply


def test_the_sandbox_relay_skips_a_proxy_that_never_answers(tmp_path: Path) -> None:
    async def main() -> tuple[bytes, bytes, list[tuple[str, int]], float]:
        refused: list[tuple[str, int]] = []
        with unanswering_address() as dead:
            dead_seen.append(dead)
            async with live_proxy() as live:
                path = str(tmp_path / "proxy.sock")
                server = await serve_unix_socket_router(
                    path, lambda: [dead, live], refused.append, connect_timeout=1.0
                )
                alone = str(tmp_path / "alone.sock")
                only_dead = await serve_unix_socket_router(alone, lambda: [dead], connect_timeout=1.0)
                started = time.monotonic()
                via_next = await asyncio.wait_for(_ask(path), BOUND_S)
                closed = await asyncio.wait_for(_ask(alone), BOUND_S)
                elapsed = time.monotonic() - started
                for s in (server, only_dead):
                    s.close()
        return via_next, closed, refused, elapsed

    dead_seen: list[tuple[str, int]] = []
    via_next, closed, refused, elapsed = asyncio.run(main())
    assert via_next.endswith(b"live")  # the next proxy answered
    assert closed == b""  # no proxy accepted: the agent's connection is closed, not held
    assert refused == [dead_seen[0]] and elapsed < BOUND_S


def test_the_proxy_ring_fails_over_from_a_proxy_that_never_answers(tmp_path: Path, sqlite_url: str) -> None:
    async def main(ring_store: object) -> tuple[int, bytes, bytes, float]:
        with unanswering_address() as (dead_host, dead_port):
            async with live_proxy() as (live_host, live_port):
                dead_url, live_url = f"http://{dead_host}:{dead_port}", f"http://{live_host}:{live_port}"
                ring = ProxyRing([dead_url, live_url], "admin", ring_store, connect_timeout=1.0)  # type: ignore[arg-type]
                sid = next(
                    k for k in (uuid.uuid4().hex for _ in range(1000)) if ring.ring.walk(k)[0] == dead_url
                )
                started = time.monotonic()
                async with ring.http_client(sid, timeout=600) as client:
                    # a per-request timeout, as the openai SDK sends its own with every request
                    request = client.get(f"{dead_url}/s/token/v1/models", timeout=600)
                    resp = await asyncio.wait_for(request, BOUND_S)
                path = str(tmp_path / "session.sock")
                server = await ring.serve_session_socket(sid, path)
                other = str(tmp_path / "other.sock")
                again = await ring.serve_session_socket(uuid.uuid4().hex, other)
                relayed = await asyncio.wait_for(_ask(path), BOUND_S)
                relayed_again = await asyncio.wait_for(_ask(other), BOUND_S)
                elapsed = time.monotonic() - started
                for s in (server, again):
                    s.close()
                assert ring.health.dead_until.get(dead_url, 0) > 0  # marked down: skipped for a while
        return resp.status_code, resp.content + relayed, relayed_again, elapsed

    with open_store(sqlite_url, tmp_path / "home") as store:
        status, body, again, elapsed = asyncio.run(main(store))
    assert status == 200 and body == b"live" + REPLY and again.endswith(b"live")
    assert elapsed < BOUND_S


def test_an_engine_connection_that_is_never_accepted_fails_as_a_connect_timeout() -> None:
    async def main() -> TransportError:
        with unanswering_address() as (host, port):
            pool = ConnectionPool(host, port, connect_timeout=1.0, read_timeout=600)
            with pytest.raises(TransportError) as e:
                async with asyncio.timeout(BOUND_S), pool.exchange("POST", "/generate", b"{}"):
                    pass
            await pool.aclose()
            return e.value

    assert asyncio.run(main()).kind == "ConnectTimeout"


def test_a_postgresql_connect_to_a_server_that_never_answers_fails_within_its_timeout() -> None:
    with unanswering_address() as (host, port):
        engine = make_engine(f"postgresql://u@{host}:{port}/db", pool_size=1, connect_timeout_s=2)
        assert engine.url.query["connect_timeout"] == "2"
        started = time.monotonic()
        with pytest.raises(OperationalError, match="timeout"):
            engine.connect().close()
        assert time.monotonic() - started < BOUND_S
        engine.dispose()


def test_a_connect_timeout_in_the_url_wins_and_other_urls_are_left_alone() -> None:
    assert with_connect_timeout("postgresql+psycopg://u@h/db?connect_timeout=3", 10).endswith(
        "?connect_timeout=3"
    )
    assert with_connect_timeout("postgresql+psycopg://u@h/db", 7).endswith("/db?connect_timeout=7")
    assert with_connect_timeout("sqlite:///x.db", 7) == "sqlite:///x.db"


def test_every_connect_timeout_setting_is_in_docs_scale_md_with_its_default() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "scale.md").read_text(encoding="utf-8")
    for name in (
        "proxy_connect_timeout_s",
        "engine_connect_timeout_s",
        "database_connect_timeout_s",
        "e2b_request_timeout_s",
    ):
        default = Settings.model_fields[name].default
        assert f"| `DRESSAGE_{name.upper()}` | {default:g} |" in text, name
