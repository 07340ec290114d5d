"""Serving the viewer: uvicorn that ends the live event streams when it shuts down.

uvicorn's graceful shutdown waits for every open response to finish, and a page left open holds
an endless server-sent-events response (:mod:`dressage.view.live`): Ctrl-C would wait for the
browser to go away, and the stream would go on polling the log meanwhile. :class:`ViewServer`
tells the app's streams to end first, so they finish within one poll and uvicorn stops at once.
"""

from __future__ import annotations

import socket

import uvicorn

from dressage.view.live import LiveStreams


class ViewServer(uvicorn.Server):
    """A uvicorn server for an app made by :func:`dressage.view.app.create_app`."""

    def __init__(self, config: uvicorn.Config, streams: LiveStreams) -> None:
        super().__init__(config)
        self.streams = streams

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End the live streams, then shut down as uvicorn does."""
        self.streams.close()
        await super().shutdown(sockets)
