"""Graceful stops: SIGINT and SIGTERM (and a ``dressage-worker stop`` request) end a command cleanly.

A long-running command (``rollout``, ``loop``, ``fork``, ``train``, the Ray driver) creates one
:class:`StopFlag` and calls :func:`install_signal_handlers` at its start. The handlers replace
whatever disposition the process inherited: a script's background job inherits SIGINT as ignored,
and asyncio would otherwise turn SIGINT into a cancellation that tears the run down mid-step. A
first signal only sets the flag: the command stops claiming work, leaves what is in flight for the
next attempt to take over, stops its engine last, and exits with :data:`SIGNAL_EXIT_CODES`'s code
(130 for SIGINT, 143 for SIGTERM), printing how to resume (:class:`~dressage.errors.Interrupted`).
A second signal raises :class:`KeyboardInterrupt` (the forced, non-graceful way out).

Other sources of a stop (the log's stop requests, :mod:`dressage.rollout.stop_requests`) are
polled through :meth:`StopFlag.poll`, so every process sees one flag whatever asked it to stop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNAL_EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}
"""Exit code of a command stopped by a signal: 128 + the signal's number, the shells' convention."""

STOP_REQUEST_EXIT_CODE = 143
"""Exit code of a command stopped by a ``dressage-worker stop`` request (the log's SIGTERM)."""


class StopFlag:
    """Set once when the process is asked to stop; thread-safe, pollable, awaitable.

    ``reason`` says what asked (``SIGINT``, ``SIGTERM``, a stop request) and ``exit_code`` what the
    command exits with. ``sources`` are callables :meth:`poll` runs (each may call :meth:`request`):
    a log watch, for instance; they may block, so async code polls in a thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = threading.Event()
        self.reason: str | None = None
        self.exit_code = 0
        self.sources: list[Callable[[], None]] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def request(self, reason: str, exit_code: int) -> bool:
        """Ask to stop; True the first time (later requests keep the first reason and code)."""
        with self._lock:
            if self._set.is_set():
                return False
            self.reason, self.exit_code = reason, exit_code
            self._set.set()
            waiters = list(self._waiters)
        for loop, event in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
        return True

    def is_set(self) -> bool:
        """Whether a stop was asked for."""
        return self._set.is_set()

    def poll(self) -> bool:
        """Run every source (they may request a stop); whether a stop was asked for."""
        if not self.is_set():
            for source in list(self.sources):
                source()
        return self.is_set()

    async def wait(self) -> None:
        """Return once a stop was asked for (from any thread or a signal handler)."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self._set.is_set():
                return
            self._waiters.append(entry)
        try:
            await event.wait()
        finally:
            with self._lock:
                self._waiters.remove(entry)


def install_signal_handlers(flag: StopFlag, say: Callable[[str], None] | None = None) -> None:
    """Make SIGINT and SIGTERM set ``flag`` (the first one) or raise :class:`KeyboardInterrupt`
    (the second), whatever disposition the process inherited. Call it from the main thread at the
    command's start. ``say`` (default: :func:`announce`, a line on stderr) says what happens next."""
    say = say or announce

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if flag.request(name, SIGNAL_EXIT_CODES[signum]):
            say(
                f"{name}: stopping gracefully (no new work; what is in flight is left to resume); "
                f"send it again to stop at once"
            )
            return
        raise KeyboardInterrupt(name)

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (a command driven from a thread: a test's)
    for signum in SIGNAL_EXIT_CODES:
        signal.signal(signum, handler)


@contextmanager
def signal_handlers_restored() -> Iterator[None]:
    """Put SIGINT's and SIGTERM's handlers back as they were on exit: a command run in-process (a
    test's CLI runner) leaves the process as it found it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in SIGNAL_EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: set outside Python, nothing this process can put back
                signal.signal(signum, handler)


def graceful_stop() -> StopFlag:
    """A new :class:`StopFlag` that SIGINT and SIGTERM set (:func:`install_signal_handlers`): what a
    long-running command creates first."""
    flag = StopFlag()
    install_signal_handlers(flag)
    return flag


def announce(text: str) -> None:
    """One line on stderr, written whole (safe from a signal handler, unlike buffered printing):
    what stopping the command does, said when the stop is asked for."""
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
