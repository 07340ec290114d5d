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
* the timeout handler here (:class:`KeepAliveProtocol`) first checks whether the socket has bytes
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
import select
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


def has_pending_bytes(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has something to read right now (request bytes, or the peer's close).

    ``poll``, not ``select``: a proxy with thousands of connections has descriptors past select's
    limit of 1024.
    """
    if sock is None:
        return False
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed or invalid descriptor: nothing to keep open for
        return False


class KeepAliveProtocol(H11Protocol):
    """uvicorn's h11 protocol whose idle timeout spares a connection with a request arriving."""

    transport: asyncio.Transport

    def timeout_keep_alive_handler(self) -> None:
        """Close the idle connection, unless bytes are waiting (they are read on the next iteration)."""
        sock: Any = self.transport.get_extra_info("socket") if not self.transport.is_closing() else None
        if has_pending_bytes(sock):
            self.timeout_keep_alive_task = None
            return
        super().timeout_keep_alive_handler()
