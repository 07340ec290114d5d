"""Response bytes written together leave in one socket write.

uvicorn writes a response's head as soon as the app starts it, then each body part: a JSON reply
is two ``send`` system calls, a short stream a handful. On loopback each write also wakes the
reader, and a py-spy profile of the proxy (docs/scale.md) put more CPU in those writes than in
building the reply. :class:`CoalescingTransport` wraps a connection's transport: writes made in
one event-loop step are buffered and leave as one write right after that step (``call_soon``),
so a reply the app produces at once (head and body, or a stream's events made together) is one
system call, and nothing waits longer than the current step. ``close`` and ``write_eof`` flush
first; everything else is the wrapped transport's.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport(asyncio.Transport):
    """A transport whose writes within one loop step are sent together."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer ``data``; the buffer is written after the current loop step."""
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        """Buffer every part."""
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what is buffered (one write), unless the connection is closing."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Flush, then close."""
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        """Flush, then half-close."""
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        """Drop what is buffered and abort."""
        self._pending.clear()
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(p) for p in self._pending)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()
