"""Transport details that decide latency: accepted connections must have TCP_NODELAY set.

Without it, a small response's last segment waits for the client's delayed ACK (~40 ms per call),
which once made every agent turn 40 ms slower than the proxy's own work.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

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
        await server.start()
        try:
            await asyncio.sleep(0.05)  # serve() is running in the main thread's loop
            return before, {sig: signal.getsignal(sig) for sig in signals}
        finally:
            await server.stop()
            store.close()

    before, during = asyncio.run(probe())
    assert during == before
