"""Reaching the TITO proxy from a sandbox that has no network.

The path of one request, agent -> proxy::

    agent in sandbox --TCP--> 127.0.0.1:<proxy_port> (sandbox's own loopback, own netns)
        -> _forwarder.py (in the sandbox) --Unix--> /run/dressage/proxy.sock (bind mount of
           spec.proxy_socket) -> serve_unix_socket_forwarder (host, asyncio) --TCP--> proxy

No network namespace is shared and no host port is reachable from inside: the only way out is
the one socket file, and what listens on it decides where bytes go (the proxy's port only). One
host forwarder can serve every sandbox of a worker; put the socket in a directory only the worker
can read. The HTTP bytes pass through unchanged, so the proxy's bearer token still identifies the
session.

With several standalone proxies (``proxy.urls``), a worker serves one socket per session
(:func:`serve_unix_socket_router`): each connection goes to the session's proxy on the hash ring,
or to the next one when that proxy refuses the connection or does not accept it within
``connect_timeout`` seconds (``Settings.proxy_connect_timeout_s``). Without that bound a proxy whose
host is gone (no reset comes back, the SYNs go unanswered) held every connection for the kernel's
SYN retries, about 2 minutes, before the next proxy was tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence

from dressage.config import PROXY_CONNECT_TIMEOUT_S

Target = tuple[str, int]
"""A proxy's ``(host, port)``."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    targets: Callable[[], Sequence[Target]],
    refused: Callable[[Target], None] | None,
    connect_timeout: float,
) -> None:
    upstream = None
    for target in targets():
        try:
            async with asyncio.timeout(connect_timeout):
                upstream = await asyncio.open_connection(*target)
            break
        except (OSError, TimeoutError):
            if refused is not None:
                refused(target)
    if upstream is None:
        writer.close()
        return
    up_reader, up_writer = upstream
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()
            with contextlib.suppress(OSError, ConnectionError):
                await w.wait_closed()


async def serve_unix_socket_forwarder(
    socket_path: str, target_host: str, target_port: int, *, connect_timeout: float = PROXY_CONNECT_TIMEOUT_S
) -> asyncio.Server:
    """Listen on the Unix socket ``socket_path`` and relay each connection to ``target_host:target_port``.

    Returns the started :class:`asyncio.Server` (close it with ``server.close()``). A stale socket
    file at ``socket_path`` is replaced. The socket is made world-connectable (0o666) because the
    sandbox user is not the worker's user; restrict access with the directory's permissions. A
    connection the target does not accept within ``connect_timeout`` seconds is closed.
    """
    return await serve_unix_socket_router(
        socket_path, lambda: [(target_host, target_port)], connect_timeout=connect_timeout
    )


async def serve_unix_socket_router(
    socket_path: str,
    targets: Callable[[], Sequence[Target]],
    refused: Callable[[Target], None] | None = None,
    *,
    connect_timeout: float = PROXY_CONNECT_TIMEOUT_S,
) -> asyncio.Server:
    """Like :func:`serve_unix_socket_forwarder`, to the first of ``targets()`` (asked per connection)
    that accepts the connection within ``connect_timeout`` seconds; ``refused`` hears of each one
    that did not."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(
        lambda r, w: _relay(r, w, targets, refused, connect_timeout), path=socket_path
    )
    os.chmod(socket_path, 0o666)
    return server
