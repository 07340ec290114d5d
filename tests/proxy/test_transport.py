"""Transport details that decide latency: accepted connections must have TCP_NODELAY set.

Without it, a small response's last segment waits for the client's delayed ACK (~40 ms per call),
which once made every agent turn 40 ms slower than the proxy's own work.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.proxy import ProxyServer
from dressage.store import EventStore


def test_accepted_connections_have_tcp_nodelay(tmp_path: Path) -> None:
    async def probe() -> list[int]:
        store = EventStore.open(settings=Settings(home=tmp_path))
        server = ProxyServer(store, ["http://127.0.0.1:9"], settings=Settings())
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            flags = []
            for uv in server._servers:
                for conn in uv.server_state.connections:
                    sock = conn.transport.get_extra_info("socket")
                    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                        flags.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            return flags
        finally:
            await server.stop()
            store.close()

    flags = asyncio.run(probe())
    assert flags and all(flags), f"TCP_NODELAY not set on accepted proxy connections: {flags}"


def test_embedded_proxy_leaves_signal_handlers_alone(tmp_path: Path) -> None:
    """A worker embedding the proxy must hear SIGINT/SIGTERM itself (uvicorn would take them over)."""
    import signal

    signals = (signal.SIGINT, signal.SIGTERM)

    async def probe() -> tuple[dict[int, object], dict[int, object]]:
        before = {sig: signal.getsignal(sig) for sig in signals}  # asyncio.run's own SIGINT handler
        store = EventStore.open(settings=Settings(home=tmp_path))
        server = ProxyServer(store, ["http://127.0.0.1:9"], settings=Settings())
        await server.start()  # returns once serve() has started in this thread's loop (signals taken)
        try:
            return before, {sig: signal.getsignal(sig) for sig in signals}
        finally:
            await server.stop()
            store.close()

    before, during = asyncio.run(probe())
    assert during == before


HEALTH = b"GET /health HTTP/1.1\r\nHost: proxy\r\n\r\n"


def _read_reply(sock: socket.socket) -> bytes:
    """One HTTP response (head and Content-Length body), or b"" when the server reset or closed."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            body += chunk
        return head + b"\r\n\r\n" + body
    except ConnectionResetError:
        return b""


def _request_at_keep_alive_expiry(tmp_path: Path, *, uvloop: bool = False) -> bytes:
    """A keep-alive request that reaches the proxy in the loop iteration its idle timeout fires.

    The schedule a starved event loop produces by chance, made deterministic: the loop is blocked
    past the connection's keep-alive deadline; on the next iteration a callback due just before
    that deadline sends the client's next request, after the poll and before the timeout handler
    runs. Returns the client's reply (b"" for a connection closed or reset with no reply).
    """

    async def probe() -> bytes:
        store = EventStore.open(settings=Settings(home=tmp_path))
        server = ProxyServer(store, ["http://127.0.0.1:9"], settings=Settings(proxy_keep_alive_s=0.3))
        await server.start()
        client = socket.create_connection(("127.0.0.1", server.port))
        try:
            client.sendall(HEALTH)
            first = await asyncio.to_thread(_read_reply, client)
            assert b" 200 " in first.split(b"\r\n", 1)[0], first
            (conn,) = server._servers[0].server_state.connections
            deadline = conn.timeout_keep_alive_task.when()
            loop = asyncio.get_running_loop()
            loop.call_at(deadline - 0.001, client.sendall, HEALTH)
            time.sleep(max(0.0, deadline - loop.time()) + 0.02)  # starve the loop past both
            return await asyncio.to_thread(_read_reply, client)
        finally:
            client.close()
            await server.stop()
            store.close()

    if uvloop:
        from dressage.proxy.eventloop import run

        return run(probe())
    return asyncio.run(probe())


def test_request_arriving_as_keep_alive_expires_is_served(tmp_path: Path) -> None:
    """The ``httpx.ReadError`` seen under load: the proxy must not close a connection carrying a request."""
    reply = _request_at_keep_alive_expiry(tmp_path)
    assert reply.startswith(b"HTTP/1.1 200 "), f"request at keep-alive expiry got no reply: {reply!r}"


def test_h11_keep_alive_protocol_serves_that_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule on the h11 variant (uvicorn's pure-Python parser)."""
    from dressage.proxy.keepalive import KeepAliveProtocol

    monkeypatch.setattr("dressage.proxy.server.HttpToolsKeepAliveProtocol", KeepAliveProtocol)
    reply = _request_at_keep_alive_expiry(tmp_path)
    assert reply.startswith(b"HTTP/1.1 200 "), f"request at keep-alive expiry got no reply: {reply!r}"


def test_request_arriving_as_keep_alive_expires_is_served_on_uvloop(tmp_path: Path) -> None:
    """The proxy's processes run uvloop (:mod:`dressage.proxy.eventloop`): the rule holds there too."""
    reply = _request_at_keep_alive_expiry(tmp_path, uvloop=True)
    assert reply.startswith(b"HTTP/1.1 200 "), f"request at keep-alive expiry got no reply: {reply!r}"


@pytest.mark.parametrize("stock", ["h11", "httptools"])
def test_stock_uvicorn_protocol_drops_that_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stock: str
) -> None:
    """The same schedule against uvicorn's own protocols loses the request (the bug reproduced)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    protocol = H11Protocol if stock == "h11" else HttpToolsProtocol
    monkeypatch.setattr("dressage.proxy.server.HttpToolsKeepAliveProtocol", protocol)
    assert _request_at_keep_alive_expiry(tmp_path) == b""


def test_keep_alive_outlasts_client_pool_expiry() -> None:
    """The proxy keeps idle connections longer than httpx/openai (5 s) and Go/reqwest (90 s) pools do."""
    import httpx

    assert Settings().proxy_keep_alive_s > max(90.0, httpx.Limits().keepalive_expiry or 0)


def test_pending_bytes_seen_on_descriptors_past_select_limit() -> None:
    """At thousands of connections a socket's descriptor exceeds 1024, where select() cannot look."""
    import fcntl
    import resource

    from dressage.proxy.keepalive import has_pending_bytes

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1100:
        pytest.skip(f"the descriptor limit ({soft}) leaves no room past 1024")
    a, b = socket.socketpair()
    high = [socket.socket(fileno=fcntl.fcntl(s.fileno(), fcntl.F_DUPFD, 1030)) for s in (a, b)]
    assert all(s.fileno() > 1024 for s in high)
    a.close()
    b.close()
    try:
        assert not has_pending_bytes(high[0])
        high[1].sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert has_pending_bytes(high[0])
    finally:
        for s in high:
            s.close()


def test_writes_of_one_loop_step_leave_as_one_socket_write() -> None:
    """A reply's head and body (or a stream's events made together) are one ``send``, flushed
    right after the step that wrote them; close() flushes first."""
    from dressage.proxy.write_coalescing import CoalescingTransport

    async def probe() -> tuple[list[bytes], bytes]:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        sent: list[bytes] = []
        real_write = transport.write

        def write(data: bytes) -> None:  # observe the real transport's writes
            sent.append(bytes(data))
            real_write(data)

        transport.write = write  # type: ignore[method-assign]
        assert isinstance(transport, asyncio.Transport)
        coalescing = CoalescingTransport(transport, loop)
        coalescing.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        coalescing.writelines([b"o", b"k"])
        assert sent == [] and coalescing.get_write_buffer_size() == 40
        await asyncio.sleep(0)  # the step ends: one write
        coalescing.write(b"bye")
        coalescing.close()
        b.setblocking(True)
        received = b""
        while chunk := await asyncio.to_thread(b.recv, 65536):
            received += chunk
        b.close()
        return sent, received

    sent, received = asyncio.run(probe())
    assert sent == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"bye"]
    assert received == b"".join(sent)
