"""The event loop the proxy's processes run on: uvloop (libuv) where it is installed.

uvloop is a pinned dependency on Linux and macOS; a platform without it (Windows) falls back to
asyncio's own loop. The proxy's transports, timers and the keep-alive rule
(:mod:`dressage.proxy.keepalive`) work on both; uvloop makes each turn's socket and timer work
cheaper (docs/scale.md, the proxy section).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's ``new_event_loop`` when installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # a platform uvloop does not build for
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[object, object, T]) -> T:
    """``asyncio.run(main)`` on the proxy's event loop (uvloop where installed)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
