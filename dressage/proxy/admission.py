"""Admission control: a bounded amount of the proxy's own work at once, a bounded FIFO queue, fast refusal.

Under overload a proxy that starts every request at once slows all of them down together until the
clients' timeouts fire, and the turns it still records reach nobody (docs/scale.md, "What broke").
:class:`AdmissionGate` bounds the turns in the proxy's CPU-heavy phases instead:

* a turn is *active* from its admission until its engine generation starts (authentication, body,
  parse, render, tokenize, plan) and again from the end of its generation until it is answered
  (recording, the reply); while the engine generates it holds no slot, so engine generations are
  never serialized (SGLang batches thousands);
* a new request is admitted while fewer than ``max_active`` turns are active and nobody waits;
  otherwise it waits in a FIFO queue of at most ``max_queue`` requests, and is refused (HTTP 503,
  ``Retry-After``, code ``overloaded``, nothing recorded) when the queue is full or after waiting
  ``queue_timeout_s``;
* a turn coming back from the engine is always counted again without waiting (:meth:`rejoin`):
  admitted work is finished first, and new work waits until the active count is below the bound.

The official OpenAI and Anthropic SDKs retry a 503 (twice by default) after the ``Retry-After`` delay.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from dressage.proxy.errors import OverloadedError
from dressage.proxy.metrics import ProxyMetrics


class AdmissionGate:
    """Counts active turns and queues (or refuses) new ones past ``max_active``; one per proxy."""

    def __init__(
        self,
        max_active: int,
        max_queue: int,
        queue_timeout_s: float,
        retry_after_s: float,
        metrics: ProxyMetrics,
    ) -> None:
        self.max_active = max_active
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.retry_after = max(1, math.ceil(retry_after_s))
        self.metrics = metrics
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests in the queue now."""
        return len(self._waiters)

    def _refuse(self, reason: str) -> OverloadedError:
        self.metrics.refused.labels(reason).inc()
        return OverloadedError(reason, self.retry_after)

    def _gauges(self) -> None:
        self.metrics.active.set(self.active)
        self.metrics.queued.set(len(self._waiters))

    async def enter(self) -> None:
        """Admit a new request: at once, after its turn in the queue, or raise :class:`OverloadedError`."""
        if self.active < self.max_active and not self._waiters:
            self.active += 1
            self._gauges()
            return
        if len(self._waiters) >= self.max_queue:
            raise self._refuse("queue_full")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._gauges()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await waiter
        except BaseException as e:
            if waiter.done() and not waiter.cancelled():  # a slot was handed over as the wait ended
                if isinstance(e, TimeoutError):
                    return
                self.leave()
                raise
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            self._gauges()
            if isinstance(e, TimeoutError):
                raise self._refuse("queue_timeout") from None
            raise

    def rejoin(self) -> None:
        """Count an admitted turn again (its generation ended): never waits, may exceed ``max_active``."""
        self.active += 1
        self._gauges()

    def leave(self) -> None:
        """A turn stops being active; its slot passes to the oldest waiter while below the bound."""
        if self.active <= self.max_active:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot changes hands: the active count stays
                    self._gauges()
                    return
        self.active -= 1
        self._gauges()
