"""Engine supervision for a rollout worker: health probes, restarts and failover.

A worker that runs the proxy itself watches the engines behind it: every ``worker.engine_probe_s``
it probes each engine's ``/health`` through the proxy's :class:`~dressage.engines.EnginePool`, which
then routes no new session (and no next turn of a pinned session) to a dead one. An engine the worker
started itself (the CPU dev engine) is restarted on its port, at most ``worker.engine_restarts``
times in the run. When no engine is up and none can come back, :attr:`EngineSupervisor.lost` is set:
the lease loop stops claiming and the worker exits non-zero saying how to resume.

An episode asks :meth:`EngineSupervisor.faulted_since` whether an engine failed while it ran: its
session then ends as an *infrastructure* interruption (continued by the next attempt, never a task
failure), see :mod:`dressage.rollout.episode`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType

from dressage.engines import EnginePool
from dressage.errors import EngineError, EnginesLostError
from dressage.rollout.engine_process import DevEngineProcess

log = logging.getLogger(__name__)

DEAD_AFTER_PROBES = 2
"""An engine whose probes failed for this many probe intervals is dead (its process exiting is enough)."""

ENGINE_UNREACHABLE = re.compile(r"engine at \S+ is unreachable|no healthy engine among")
"""What the proxy's 502 says when the engine behind it is gone (the client's and the pool's wording):
how a worker without its own engines (standalone proxies) recognises an engine fault."""


@dataclass
class EngineState:
    """One engine as the supervisor sees it."""

    url: str
    process: DevEngineProcess | None = None
    """The engine process this worker started (restartable); None for an engine given by URL."""
    up: bool = True
    failing_since: float | None = None
    """When its probes started failing (None while they answer)."""
    restarts: int = 0
    restarting: bool = False
    gave_up: str | None = None
    """Why the engine will not come back (restarts spent, or not this worker's to restart)."""
    died: list[str] = field(default_factory=list)
    """How it died, each time (``exit -9``, ``/health unanswered``)."""


class EngineSupervisor:
    """Probe, restart and fail over the engines behind a worker's own proxy; see the module docstring."""

    def __init__(
        self,
        pool: EnginePool,
        processes: Mapping[str, DevEngineProcess] | None = None,
        *,
        max_restarts: int = 3,
        probe_s: float = 1.0,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        procs = {u.rstrip("/"): p for u, p in (processes or {}).items()}
        self.pool = pool
        self.engines = {c.base_url: EngineState(c.base_url, procs.get(c.base_url)) for c in pool.clients}
        self.max_restarts = max_restarts
        self.probe_s = probe_s
        self.notify = notify
        """Told each death and restart in one line (the worker's console); logged without it."""
        self.faults = 0
        """Engine deaths seen so far (an episode compares it with the value at its start)."""
        self.lost = asyncio.Event()
        """Set once no engine is up and none can come back."""
        self._probe_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._prober: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start probing every ``probe_s`` seconds (in this event loop)."""
        self._prober = asyncio.create_task(self._probe_forever())

    async def stop(self) -> None:
        """Stop probing and any restart under way."""
        tasks = [*self._tasks, *([self._prober] if self._prober else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def __aenter__(self) -> EngineSupervisor:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def lost_error(self, run: str, unplayed: int) -> EnginesLostError:
        """The worker's one-line closing error once :attr:`lost` is set."""
        return EnginesLostError(
            f"{self.describe_loss()}; the worker stopped claiming and {unplayed} pairs are left to play: "
            f"resume with dressage-worker rollout --resume {run}"
        )

    @property
    def available(self) -> bool:
        """Whether some engine answers its probes (new sessions can start)."""
        return any(e.up and not e.restarting and e.failing_since is None for e in self.engines.values())

    def mark(self) -> int:
        """The fault count now: pass it to :meth:`faulted_since` when an episode fails."""
        return self.faults

    async def faulted_since(self, mark: int) -> bool:
        """Whether an engine died since :meth:`mark` returned ``mark`` (probing every engine now, and
        waiting for the verdict on one whose probes have started failing)."""
        await self.probe()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (DEAD_AFTER_PROBES + 1) * self.probe_s
        while self.faults <= mark and self._failing() and loop.time() < deadline:
            await asyncio.sleep(self.probe_s / 2)
            await self.probe()
        return self.faults > mark

    def _failing(self) -> bool:
        """Whether an engine not yet declared dead is failing its probes."""
        return any(e.up and e.failing_since is not None for e in self.engines.values())

    async def probe(self) -> None:
        """Probe every engine once: mark the dead ones in the pool, restart ours, detect a total loss."""
        async with self._probe_lock:
            health = await self.pool.check_health()
            now = time.monotonic()
            for url, ok in health.items():
                state = self.engines[url]
                if state.restarting:
                    continue
                if ok:
                    state.up, state.failing_since = True, None
                    continue
                state.failing_since = state.failing_since or now
                if state.up and self._dead(state, now):
                    self._died(state)
            self._mark_restarting()
            if not any(e.up or e.restarting for e in self.engines.values()):
                self.lost.set()

    def describe_loss(self) -> str:
        """One clause per engine: what happened to it (for the worker's closing error)."""
        return "; ".join(
            f"the engine at {e.url} died ({', '.join(e.died) or 'unreachable'}) and {e.gave_up or 'did not come back'}"
            for e in self.engines.values()
        )

    def _dead(self, state: EngineState, now: float) -> bool:
        """Whether a failing engine is dead: its process exited, or its probes have failed for
        ``DEAD_AFTER_PROBES`` intervals (a busy engine that misses one probe is not restarted; the
        pool routes nothing new to it meanwhile)."""
        if state.process is not None and state.process.exit_code() is not None:
            return True
        assert state.failing_since is not None
        return now - state.failing_since >= DEAD_AFTER_PROBES * self.probe_s

    def _died(self, state: EngineState) -> None:
        state.up = False
        self.faults += 1
        code = state.process.exit_code() if state.process is not None else None
        state.died.append(f"exit {code}" if code is not None else "/health unanswered")
        if state.process is None:
            state.gave_up = "is not this worker's to restart"
        elif state.restarts >= self.max_restarts:
            state.gave_up = self._spent()
        else:
            state.restarting = True
            task = asyncio.create_task(self._restart(state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        then = (
            f"restarting it ({state.restarts + 1} of {self.max_restarts})"
            if state.restarting
            else f"it {state.gave_up}"
        )
        self._say(f"the engine at {state.url} died ({state.died[-1]}); {then}")

    def _spent(self) -> str:
        if self.max_restarts == 0:
            return "worker.engine_restarts is 0"
        return f"its {self.max_restarts} restarts (worker.engine_restarts) are spent"

    def _mark_restarting(self) -> None:
        """Keep restarting engines out of the pool until they answer (a probe may find them up early)."""
        for state in self.engines.values():
            if state.restarting:
                self.pool.mark_unhealthy(state.url)

    async def _restart(self, state: EngineState) -> None:
        """Restart our engine until it answers or the restarts are spent; then let the pool use it."""
        assert state.process is not None
        while state.restarts < self.max_restarts:
            state.restarts += 1
            try:
                await state.process.restart()
            except EngineError as e:
                self._say(f"restart {state.restarts} of the engine at {state.url} failed: {e}")
                continue
            self._say(f"the engine at {state.url} is back (restart {state.restarts} of {self.max_restarts})")
            state.restarting, state.up, state.failing_since = False, True, None
            await self.probe()
            return
        state.restarting = False
        state.gave_up = self._spent()
        await self.probe()

    def _say(self, line: str) -> None:
        if self.notify is not None:
            self.notify(line)
        else:
            log.warning("%s", line)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                await self.probe()
            except Exception:  # a probe must never stop supervision
                log.exception("probing the engines failed")


def supervise(
    proxy: object,
    engine: DevEngineProcess | None,
    *,
    max_restarts: int,
    probe_s: float,
    notify: Callable[[str], None] | None = None,
) -> EngineSupervisor | None:
    """A started supervisor of the engines behind ``proxy`` (a worker's own proxy, which holds an
    :class:`EnginePool`), restarting ``engine`` if given; None for standalone proxies (no pool here)."""
    pool = getattr(proxy, "pool", None)
    if not isinstance(pool, EnginePool):
        return None
    supervisor = EngineSupervisor(
        pool,
        {engine.url: engine} if engine is not None else None,
        max_restarts=max_restarts,
        probe_s=probe_s,
        notify=notify,
    )
    supervisor.start()
    return supervisor


def is_engine_fault(error: str | None) -> bool:
    """Whether a failed episode's error is the proxy reporting its engine unreachable."""
    return bool(error) and ENGINE_UNREACHABLE.search(error or "") is not None
