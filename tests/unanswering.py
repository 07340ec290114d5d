"""A loopback TCP address that never answers a connect: the SYN of a new connection is dropped.

A listening socket with backlog 0 whose accept queue is full (filled here, never ``accept()``ed)
drops further SYNs, as a host that is gone does: the client's connect neither succeeds nor is
refused, it waits. Only 127.0.0.1 is used; no packet leaves the machine.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


@contextmanager
def unanswering_address() -> Iterator[tuple[str, int]]:
    """``(host, port)`` on loopback where a connect hangs until the client's own timeout."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(64):  # fill the accept queue until a connect is left waiting
            probe = stack.enter_context(socket.socket())
            probe.settimeout(0.5)
            try:
                probe.connect(address)
            except TimeoutError:
                break
        else:
            raise RuntimeError("the listener kept accepting connections; cannot make it unanswering")
        yield address
