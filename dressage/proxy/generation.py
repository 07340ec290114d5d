"""Engine calls that survive weight updates: the pause/resume coordinator and one generation.

Pause (before a weight update): new generations wait at a gate; every in-flight engine request
is aborted by its rid (then the engines are paused), and each returns its partial output.
Resume (with the new version): the engines continue, the gate opens, and every interrupted
generation is re-submitted as ``prompt + partial ids`` with the remaining token budget, under a
new rid. The turn's tokens before and after carry the versions the engine reported for them, so
one turn can span versions; the agent only sees latency (a stream simply pauses).

Per-token versions come from the engine's ``weight_versions`` spans (numeric strings; a
non-numeric version falls back to the version given to :meth:`Coordinator.resume`, else 0).
Routed experts come from the last engine call, which covers every position from
``experts_start`` (its prefill recomputes the routing of tokens generated before the pause).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dressage.engines import EngineClient, EnginePool, SamplingParams
from dressage.engines.protocol import FinishReason, WeightVersionSpan
from dressage.errors import EngineError

log = logging.getLogger("dressage.proxy")


def version_number(version: str | None, fallback: int) -> int:
    """An engine's weight version as the log's integer (``fallback`` when not numeric)."""
    try:
        return int(version) if version is not None else fallback
    except ValueError:
        return fallback


class Coordinator:
    """Holds new generations during a weight update and tracks in-flight engine requests."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.version: int | None = None
        self.epoch = 0
        self._gate = asyncio.Event()
        self._gate.set()
        self._inflight: dict[str, EngineClient] = {}

    @property
    def paused(self) -> bool:
        """Whether generation is paused."""
        return not self._gate.is_set()

    async def wait_running(self) -> None:
        """Return once generation is not paused."""
        await self._gate.wait()

    def track(self, rid: str, client: EngineClient) -> None:
        """Register an engine request so a pause can abort it."""
        self._inflight[rid] = client

    def untrack(self, rid: str) -> None:
        """Forget a finished engine request."""
        self._inflight.pop(rid, None)

    async def pause(self) -> None:
        """Hold new generations, abort in-flight ones by rid (keeping partial output), pause engines."""
        if self.paused:
            return
        self.epoch += 1
        self._gate.clear()
        aborts = [client.abort(rid) for rid, client in list(self._inflight.items())]
        results = await asyncio.gather(*aborts, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.warning("abort during pause failed: %s", r)
        await self.pool.pause("abort")

    async def resume(self, version: int | None) -> None:
        """Continue the engines and release held generations; ``version`` is the new policy version."""
        if version is not None:
            self.version = version
        await self.pool.continue_()
        self._gate.set()


@dataclass
class Generation:
    """One turn's generation, possibly over several engine calls (one per pause).

    ``ids``/``logprobs``/``versions`` grow as tokens arrive; ``finish`` is set at the end.
    """

    coordinator: Coordinator
    client: EngineClient
    prompt_ids: Sequence[int]
    sampling: SamplingParams
    rid: str
    experts_start: int | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    experts: np.ndarray | None = None
    resumes: int = 0
    engine_seconds: float = 0.0
    _current_rid: str | None = None

    def _fallback_version(self) -> int:
        return self.coordinator.version if self.coordinator.version is not None else 0

    def _call_params(self) -> tuple[str, list[int], SamplingParams] | None:
        """(rid, input ids, sampling) of the next engine call; None when the budget is spent."""
        budget = self.sampling.max_new_tokens
        if budget is not None and budget - len(self.ids) <= 0:
            self.finish = FinishReason(type="length", length=len(self.ids))
            return None
        sampling = self.sampling
        if self.ids:
            update: dict[str, Any] = {}
            if budget is not None:
                update["max_new_tokens"] = budget - len(self.ids)
            sampling = sampling.model_copy(update=update)
        rid = self.rid if self.resumes == 0 else f"{self.rid}-r{self.resumes}"
        return rid, [*self.prompt_ids, *self.ids], sampling

    def _apply_spans(self, start: int, spans: list[WeightVersionSpan] | None) -> None:
        for span in spans or []:
            v = version_number(span.version, self._fallback_version())
            for i in range(start + span.start, min(start + span.end, len(self.versions))):
                self.versions[i] = v

    def _interrupted(self, finish: FinishReason, epoch: int) -> bool:
        """Whether an abort came from our pause (then the generation continues after resume)."""
        if finish.type != "abort":
            return False
        if self.coordinator.paused or self.coordinator.epoch != epoch:
            return True
        raise EngineError(
            f"the engine aborted generation {self._current_rid}: {finish.message or 'no reason given'}"
        )

    async def run(self) -> None:
        """Generate to the end without streaming (non-streaming engine calls)."""
        async for _ in self._calls(stream=False):
            pass

    def stream(self) -> AsyncIterator[int]:
        """Generate, yielding after each engine delta the number of new tokens (streaming calls)."""
        return self._calls(stream=True)

    async def _calls(self, stream: bool) -> AsyncIterator[int]:
        loop = asyncio.get_running_loop()
        while True:
            await self.coordinator.wait_running()
            params = self._call_params()
            if params is None:
                return
            rid, input_ids, sampling = params
            self._current_rid = rid
            epoch = self.coordinator.epoch
            start = len(self.ids)
            self.coordinator.track(rid, self.client)
            t0 = loop.time()
            experts = self.experts_start is not None
            start_len = self.experts_start or 0
            try:
                if stream:
                    finish = None
                    deltas = self.client.generate_stream(
                        input_ids,
                        sampling,
                        rid,
                        return_routed_experts=experts,
                        routed_experts_start_len=start_len,
                    )
                    async for delta in deltas:
                        fallback = version_number(delta.weight_version, self._fallback_version())
                        self._add(delta.output_ids, delta.logprobs, fallback)
                        if delta.finished:
                            finish = delta.finish_reason
                            self._apply_spans(start, delta.weight_versions)
                            self.experts = delta.routed_experts
                        if delta.output_ids:
                            yield len(delta.output_ids)
                    if finish is None:
                        raise EngineError(f"the engine closed stream {rid} without a finish reason")
                else:
                    result = await self.client.generate(
                        input_ids,
                        sampling,
                        rid,
                        return_routed_experts=experts,
                        routed_experts_start_len=start_len,
                    )
                    fallback = version_number(result.weight_version, self._fallback_version())
                    self._add(result.output_ids, result.logprobs, fallback)
                    self._apply_spans(start, result.weight_versions)
                    self.experts = result.routed_experts
                    finish = result.finish_reason
            finally:
                self.coordinator.untrack(rid)
                self.engine_seconds += loop.time() - t0
            if not self._interrupted(finish, epoch):
                self.finish = finish
                return
            self.resumes += 1
            log.info("generation %s interrupted after %d tokens; continuing after resume", rid, len(self.ids))

    def _add(self, ids: list[int], logprobs: list[float] | None, version: int) -> None:
        if not ids:
            return
        if logprobs is None or len(logprobs) != len(ids):
            raise EngineError(f"engine request {self._current_rid} returned no logprobs for its tokens")
        self.ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(ids))

    async def abort(self) -> None:
        """Abort the current engine request (the client went away)."""
        if self._current_rid is not None and self.finish is None:
            try:
                await self.client.abort(self._current_rid)
            except EngineError as e:
                log.warning("could not abort %s: %s", self._current_rid, e)
