"""Live updates: server-sent events fed by the log's dense positions.

A page subscribes with the position it was rendered at (``after``); the stream polls the run's
events past it and sends one SSE message per event (``id`` = position, so a reconnecting browser
resumes with ``Last-Event-ID`` and misses nothing: positions are dense and commit-ordered).
A run's page gets every event as ``log``; a session's page gets its own turns as ``turn`` and its
other events as ``log``. A comment line every :data:`KEEPALIVE_S` keeps proxies from closing it.

A stream ends when its client goes away, when the log cannot be read (the browser reconnects and
resumes), or when the server shuts down (:class:`LiveStreams`,
closed by :class:`dressage.view.server.ViewServer` before uvicorn waits for open responses): an
endless response would otherwise keep uvicorn's graceful shutdown waiting for as long as a page
stays open, with the stream still polling a log whose store is being closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import orjson

from dressage.errors import StoreError
from dressage.store import EventStore
from dressage.store.records import Event

log = logging.getLogger(__name__)

POLL_S = 0.25
KEEPALIVE_S = 15.0
BATCH = 500


class LiveStreams:
    """The app's open event streams' shared stop flag: set once, at server shutdown."""

    def __init__(self) -> None:
        self.closing = False

    def close(self) -> None:
        """Make every open stream end at its next poll (within :data:`POLL_S`)."""
        self.closing = True


def sse_message(event: Event, name: str) -> bytes:
    """One SSE message for ``event`` (data: position, kind, session)."""
    data = orjson.dumps({"position": event.position, "kind": event.kind, "session": event.session_id})
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.position, name.encode(), data)


async def event_stream(
    store: EventStore,
    run: str,
    after: int,
    *,
    session_id: str | None,
    disconnected: Callable[[], asyncio.Future[bool] | object],
    streams: LiveStreams,
    poll_s: float = POLL_S,
) -> AsyncIterator[bytes]:
    """SSE bytes for the run's events after ``after`` (only ``session_id``'s when given), until the
    client goes away, the log cannot be read or the server shuts down."""
    yield b"retry: 1000\n\n"
    last_sent = time.monotonic()
    while True:
        if streams.closing or await disconnected():  # type: ignore[misc]
            return
        try:
            events = await asyncio.to_thread(store.events.read, run, after, BATCH)
        except StoreError as err:
            # The log cannot be read now (database restarting, network): end this stream; the
            # browser reconnects after ``retry`` and resumes from the last position it received.
            log.warning("live stream of run %r ended: %s", run, err)
            return
        for e in events:
            after = e.position
            if session_id is not None and e.session_id != session_id:
                continue
            name = "turn" if session_id is not None and e.kind == "turn" else "log"
            yield sse_message(e, name)
            last_sent = time.monotonic()
        if len(events) == BATCH:
            continue
        if time.monotonic() - last_sent > KEEPALIVE_S:
            yield b": keepalive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(poll_s)
