"""A lean HTTP/1.1 client for the engine's hot path: ``POST /generate``, plain or streamed.

Why not httpx here: a proxy turn spent ~2.5 ms of CPU in httpx/httpcore/anyio (a py-spy profile,
docs/scale.md), most of it in generic machinery (the anyio layer, header models, the request
written as two socket writes) that one fixed request shape does not need. This client keeps
persistent connections to one ``host:port``, writes each request (head and body) with one
``write``, and reads the response with asyncio streams: ``Content-Length``, chunked, or
read-to-close bodies, and a streamed body handed out line by line as it arrives.

Connection reuse follows httpcore's rule against the keep-alive race: an idle connection is
dropped, not reused, once it is older than ``keepalive_expiry`` (4 s, before uvicorn's 5 s) or
when its socket is readable while idle (the server closed it, or sent something unasked). A
request is never re-sent after its bytes were written (``/generate`` is not idempotent), so a
connection lost mid-request is an error the caller sees (:class:`TransportError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from dressage.config import ENGINE_CONNECT_TIMEOUT_S

MAX_HEAD_BYTES = 64 * 1024
"""The longest response head (status line and headers) accepted."""


def has_pending_bytes(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has something to read right now (bytes, or the peer's close).

    ``poll``, not ``select``: a process with thousands of connections has descriptors past select's
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


class TransportError(Exception):
    """The connection failed: ``kind`` names how (``ConnectError``, ``ReadTimeout``, ``ReadError``...)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass
class Head:
    """A response's status and the headers that decide how its body is read."""

    status: int
    content_length: int | None
    chunked: bool
    keep_alive: bool


class Connection:
    """One TCP connection: the streams and when it was last idle."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def reusable(self, now: float, expiry: float) -> bool:
        """Whether an idle connection may carry the next request (fresh, open, nothing unread)."""
        if now - self.idle_since > expiry or self.writer.is_closing() or self.reader.at_eof():
            return False
        return not has_pending_bytes(self.writer.get_extra_info("socket"))

    def close(self) -> None:
        """Close without waiting (the transport finishes on its own)."""
        self.writer.close()


def parse_head(raw: bytes) -> Head:
    """The status and body framing of a response head (``raise TransportError`` when malformed)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TransportError("RemoteProtocolError", f"malformed status line {lines[0][:100]!r}")
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == "HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            if not value.isdigit():
                raise TransportError("RemoteProtocolError", f"bad content-length {value!r}")
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value
        elif name == "connection":
            keep_alive = "close" not in value if keep_alive else "keep-alive" in value
    return Head(int(parts[1]), None if chunked else length, chunked, keep_alive)


class Exchange:
    """One request's response on a borrowed connection: its head, then its body (whole or in pieces)."""

    def __init__(self, pool: ConnectionPool, conn: Connection, head: Head) -> None:
        self.pool, self.conn, self.head = pool, conn, head
        self.status = head.status
        self._done = False

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([part async for part in self.parts()])

    async def parts(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunk by chunk; one piece for a sized body)."""
        reader, head, timeout = self.conn.reader, self.head, self.pool.read_timeout
        async with self.pool.errors("ReadError", "ReadTimeout"):
            if head.chunked:
                while True:
                    async with asyncio.timeout(timeout):
                        size_line = await reader.readuntil(b"\r\n")
                        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                        data = await reader.readexactly(size + 2)
                    if size == 0:
                        if data != b"\r\n":  # trailers: read up to the blank line
                            async with asyncio.timeout(timeout):
                                await reader.readuntil(b"\r\n\r\n")
                        break
                    yield data[:-2]
            elif head.content_length is not None:
                if head.content_length:
                    async with asyncio.timeout(timeout):
                        data = await reader.readexactly(head.content_length)
                    yield data  # outside the timeout: the consumer's time is not the server's
            else:  # no framing: the body ends when the server closes
                head.keep_alive = False
                while chunk := await asyncio.wait_for(reader.read(65536), timeout):
                    yield chunk
        self._done = True

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line as it arrives (each without its ``\\n``; a last unterminated line too)."""
        pending = b""
        async for part in self.parts():
            pending += part
            if b"\n" not in part:
                continue
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line
        if pending:
            yield pending

    def release(self) -> None:
        """Give the connection back when the body was read to its end and both sides keep it."""
        if self._done and self.head.keep_alive:
            self.pool.put(self.conn)
        else:
            self.conn.close()


class ConnectionPool:
    """Persistent connections to one engine ``host:port``: at most ``max_connections`` open (more
    requests wait for one, as httpx's pool makes them), idle ones kept LIFO."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float = ENGINE_CONNECT_TIMEOUT_S,
        read_timeout: float = 600.0,
        keepalive_expiry: float = 4.0,
        max_connections: int = 4096,
    ) -> None:
        self.host, self.port = host, port
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.keepalive_expiry, self.max_idle = keepalive_expiry, max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[Connection] = []
        self._host_header = f"Host: {host}:{port}\r\n".encode()

    @contextlib.asynccontextmanager
    async def errors(self, kind: str, timeout_kind: str) -> AsyncIterator[None]:
        """Translate socket failures into :class:`TransportError` (``kind``, or ``timeout_kind``)."""
        try:
            yield
        except TimeoutError as e:
            raise TransportError(timeout_kind, f"no answer within the timeout ({e or 'timed out'})") from e
        except asyncio.IncompleteReadError as e:
            raise TransportError(kind, "the server closed the connection mid-response") from e
        except (asyncio.LimitOverrunError, ValueError) as e:
            raise TransportError("RemoteProtocolError", f"unreadable response framing: {e}") from e
        except OSError as e:
            raise TransportError(kind, str(e) or type(e).__name__) from e

    async def _connection(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable(now, self.keepalive_expiry):
                return conn
            conn.close()
        async with self.errors("ConnectError", "ConnectTimeout"), asyncio.timeout(self.connect_timeout):
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES)
        return Connection(reader, writer)

    def put(self, conn: Connection) -> None:
        """Keep an idle connection for the next request (closed when the pool is full)."""
        if len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def request_bytes(self, method: str, path: str, body: bytes, content_type: bytes) -> bytes:
        """The request head and body as one buffer (one write)."""
        head = (
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self._host_header
            + b"Content-Type: "
            + content_type
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nAccept: */*\r\n\r\n"
        )
        return head + body

    @contextlib.asynccontextmanager
    async def exchange(
        self, method: str, path: str, body: bytes, content_type: bytes = b"application/json"
    ) -> AsyncIterator[Exchange]:
        """Send one request, yield its response (head read, body not yet); the connection goes back
        to the pool only when the body was read to the end."""
        async with self._slots:
            async with self._exchange(method, path, body, content_type) as ex:
                yield ex

    @contextlib.asynccontextmanager
    async def _exchange(
        self, method: str, path: str, body: bytes, content_type: bytes
    ) -> AsyncIterator[Exchange]:
        conn = await self._connection()
        ex: Exchange | None = None
        try:
            async with self.errors("WriteError", "WriteTimeout"):
                conn.writer.write(self.request_bytes(method, path, body, content_type))
                async with asyncio.timeout(self.read_timeout):
                    await conn.writer.drain()
            async with self.errors("ReadError", "ReadTimeout"), asyncio.timeout(self.read_timeout):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            ex = Exchange(self, conn, parse_head(raw))
            yield ex
        except BaseException:
            conn.close()
            raise
        else:
            ex.release()

    async def aclose(self) -> None:
        """Close the idle connections (busy ones close when their exchange ends)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
