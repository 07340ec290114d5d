"""Idle keep-alive connections that are closed only when no request is arriving on them.

HTTP/1.1 keep-alive has a race: the server closes a connection it saw idle for its keep-alive
timeout while the client, which still counts it as live in its pool, has just sent the next
request on it. The request bytes sit unread in the server's socket when it closes, the kernel
answers them with a reset, and the client sees ``httpx.ReadError`` (connection reset, no reply)
for a request the proxy never saw, so nothing in its log.

Two things make it rare in the proxy:

* the keep-alive timeout (``Settings.proxy_keep_alive_s``, 120 s by default) is longer than the idle
  expiry of the clients' connection pools (httpx and the openai SDK 5 s, Node's undici 4 s, Go and
  reqwest 90 s), so a client drops an idle connection before the server does; uvicorn's own default
  (5 s) equals httpx's, which is how the race was met under load;
* the timeout handler here (:class:`HttpToolsKeepAliveProtocol`, what the proxy serves with, and
  :class:`KeepAliveProtocol` on uvicorn's h11 parser) first checks whether the socket has bytes
  waiting. On a starved event loop the timer and the arrival of a request can fall in the same loop
  iteration, after the poll that would have delivered the request; uvicorn's handler then closes a
  connection that carries a request. This one leaves it open and the request is served on the next
  iteration.

The remaining window (a request landing between the check and the close, microseconds) is the
protocol's own; clients retry such requests (the openai SDK does, and the proxy answers a retried
body from the log rather than generating twice).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools (a pinned dependency) missing from an older environment: serve on h11
    HttpToolsProtocol = H11Protocol  # type: ignore[misc,assignment]

from dressage.engines.http1 import has_pending_bytes
from dressage.proxy.write_coalescing import CoalescingTransport

__all__ = ["HttpToolsKeepAliveProtocol", "KeepAliveProtocol", "has_pending_bytes"]


def spare_if_pending(transport: asyncio.Transport) -> bool:
    """Whether an idle connection's timeout must spare it: bytes (a request) are waiting on it.

    Works on both event loops: asyncio's transports give the socket, uvloop's a socket-like
    object with ``fileno()`` (what ``poll`` needs).
    """
    sock: Any = transport.get_extra_info("socket") if not transport.is_closing() else None
    return has_pending_bytes(sock)


class KeepAliveProtocol(H11Protocol):
    """uvicorn's h11 protocol whose idle timeout spares a connection with a request arriving."""

    transport: asyncio.Transport

    def timeout_keep_alive_handler(self) -> None:
        """Close the idle connection, unless bytes are waiting (they are read on the next iteration)."""
        if spare_if_pending(self.transport):
            self.timeout_keep_alive_task = None
            return
        super().timeout_keep_alive_handler()


class HttpToolsKeepAliveProtocol(HttpToolsProtocol):
    """The same timeout rule on uvicorn's httptools protocol (the C parser the proxy serves with),
    and the writes of one loop step sent together (:mod:`dressage.proxy.write_coalescing`).

    The spared connection gets no new timer here; the request waiting on it is read on the next
    loop iteration, and its response re-arms the timer as on any keep-alive connection.
    """

    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Serve the connection through a :class:`CoalescingTransport`."""
        super().connection_made(CoalescingTransport(transport, self.loop))

    def timeout_keep_alive_handler(self) -> None:
        """Close the idle connection, unless bytes are waiting (they are read on the next iteration)."""
        if spare_if_pending(self.transport):
            self.timeout_keep_alive_task = None
            return
        super().timeout_keep_alive_handler()
