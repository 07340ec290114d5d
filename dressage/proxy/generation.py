"""Engine calls that survive weight updates: the pause/resume coordinator and one generation.

Pause (before a weight update): new generations wait at a gate; every in-flight engine request
is aborted by its rid (then the engines are paused), and each returns its partial output.
Resume (with the new version): the engines continue, the gate opens, and every interrupted
generation is re-submitted as ``prompt + partial ids`` with the remaining token budget, under a
new rid. The turn's tokens before and after carry the versions the engine reported for them, so
one turn can span versions; the agent only sees latency (a stream simply pauses).

Stop strings across a resume: the engine checks stop strings only in what *it* generated, so a
stop string whose first characters came before the pause and the rest after would be missed. After
a resume the generation checks the text around the seam itself; on a match it aborts the engine
request and cuts the ids right after the token that completes the stop string (the record is what
an uninterrupted engine would have produced: the matched token included, nothing after it).

Client gone: :meth:`Generation.cancel` aborts the engine request; the engine's final chunk brings
every token generated so far, and the generation ends with ``finish.type == "abort"`` instead of
raising, so the partial turn can be recorded.

Constrained decoding and penalties across a resume: the engine restarts the grammar and the
penalty counts on the re-submitted request (it cannot be given the tokens before the seam as
output), so a constrained or penalised generation that a weight update interrupts continues
unconstrained by what came before; the turn records ``resumes`` so such turns can be found.

Per-token versions come from the engine's ``weight_versions`` spans (numeric strings; a
non-numeric version falls back to the version given to :meth:`Coordinator.continue_generation`, else 0).
Routed experts come from the last engine call, which covers every position from
``experts_start`` (its prefill recomputes the routing of tokens generated before the pause).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from dressage.engines import EngineClient, EnginePool, SamplingParams
from dressage.engines.protocol import FinishReason, WeightVersionSpan, policy_version
from dressage.errors import EngineError

log = logging.getLogger("dressage.proxy")


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

    async def continue_generation(self, weight_version: int | None) -> None:
        """Continue the engines and release held generations; ``weight_version`` tags later tokens."""
        if weight_version is not None:
            self.version = weight_version
        await self.pool.continue_()
        self._gate.set()


class _EngineOptions(TypedDict):
    """Per-call engine options of a generation."""

    top_logprobs_num: int
    require_reasoning: bool


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
    decode: Callable[[list[int]], str] | None = None
    """Ids -> text (the model's tokenizer); needed to find stop strings that span a resume."""
    top_logprobs_num: int = 0
    """Alternatives per token to ask the engine for (``top`` grows with ``ids``)."""
    require_reasoning: bool = False
    """The grammar waits for the end of the thinking block (SGLang's ``require_reasoning``)."""
    think_end_id: int | None = None
    """The think-closing token id (with ``require_reasoning``: the gate is off once it was generated)."""
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    cancelled: bool = False
    _current_rid: str | None = None
    _seam: int = 0
    _cut: FinishReason | None = None

    def _fallback_version(self) -> int:
        return self.coordinator.version if self.coordinator.version is not None else 0

    def _call_params(self) -> tuple[str, Sequence[int], SamplingParams] | None:
        """(rid, input ids, sampling) of the next engine call; None when the budget is spent."""
        budget = self.sampling.max_new_tokens
        if budget is not None and budget - len(self.ids) <= 0:
            self.finish = FinishReason(type="length", length=len(self.ids))
            return None
        sampling = self.sampling
        if self.ids:
            update: dict[str, object] = {}
            if budget is not None:
                update["max_new_tokens"] = budget - len(self.ids)
            sampling = sampling.model_copy(update=update)
        rid = self.rid if self.resumes == 0 else f"{self.rid}-r{self.resumes}"
        # The first call sends the prompt view as is: the client makes the one list the body needs.
        return rid, [*self.prompt_ids, *self.ids] if self.ids else self.prompt_ids, sampling

    def _apply_spans(self, start: int, spans: list[WeightVersionSpan] | None) -> None:
        for span in spans or []:
            v = policy_version(span.version, self._fallback_version())
            for i in range(start + span.start, min(start + span.end, len(self.versions))):
                self.versions[i] = v

    def _interrupted(self, finish: FinishReason, epoch: int) -> bool:
        """Whether an abort came from our pause (then the generation continues after resume)."""
        if finish.type != "abort" or self.cancelled:
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
            if self.cancelled:  # the client left during a pause: nothing more to generate
                self.finish = FinishReason(type="abort", message="client disconnected")
                return
            params = self._call_params()
            if params is None:
                return
            rid, input_ids, sampling = params
            self._current_rid = rid
            epoch = self.coordinator.epoch
            start = self._seam = len(self.ids)
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
                        **self._options(),
                    )
                    async for delta in deltas:
                        fallback = policy_version(delta.weight_version, self._fallback_version())
                        if self._cut is None:
                            self._add(delta.output_ids, delta.logprobs, fallback, delta.top_logprobs)
                        if delta.finished:
                            finish = delta.finish_reason
                            self._apply_spans(start, delta.weight_versions)
                            self.experts = delta.routed_experts
                        elif self._cut is None and self._check_seam():
                            await self._abort_current()
                        if delta.output_ids and self._cut is None:
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
                        **self._options(),
                    )
                    fallback = policy_version(result.weight_version, self._fallback_version())
                    self._add(result.output_ids, result.logprobs, fallback, result.top_logprobs)
                    self._apply_spans(start, result.weight_versions)
                    self.experts = result.routed_experts
                    finish = result.finish_reason
                    self._check_seam()
            finally:
                self.coordinator.untrack(rid)
                self.engine_seconds += loop.time() - t0
            if self._cut is not None:
                self.finish = self._cut
                return
            if not self._interrupted(finish, epoch):
                self.finish = finish
                return
            self.resumes += 1
            log.info("generation %s interrupted after %d tokens; continuing after resume", rid, len(self.ids))

    def _check_seam(self) -> bool:
        """After a resume: cut at a stop string that spans the seam (see the module docstring).

        Only an occurrence that starts before the seam and ends after it is the proxy's to find
        (the engine found the others); it ends within ``4 * len(stop)`` tokens of the seam (a token
        is at least one byte, a character at most four). Returns True when the generation was cut.
        """
        stop_param = self.sampling.stop
        if not self._seam or not stop_param or self.decode is None:
            return False
        stops = (stop_param,) if isinstance(stop_param, str) else tuple(stop_param)
        reach = 4 * max(len(x) for x in stops)
        if len(self.ids) - self._seam > reach + 64:
            return False  # an occurrence spanning the seam was complete long ago: checked then
        lo = max(self._seam - reach, 0)
        head = self.decode(self.ids[lo : self._seam])
        text = self.decode(self.ids[lo : self._seam + reach])
        best: tuple[int, str] | None = None
        for stop in stops:
            i = text.find(stop, max(len(head) - len(stop) + 1, 0))
            if 0 <= i < len(head) and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return False
        i, stop = best
        n = self._seam + 1  # the first token count whose text holds the whole stop string
        while n < len(self.ids) and not self.decode(self.ids[lo:n]).startswith(stop, i):
            n += 1
        del self.ids[n:], self.logprobs[n:], self.versions[n:], self.top[n:]
        self._cut = FinishReason(type="stop", matched=stop)
        return True

    async def _abort_current(self) -> None:
        if self._current_rid is not None:
            try:
                await self.client.abort(self._current_rid)
            except EngineError as e:
                log.warning("could not abort %s: %s", self._current_rid, e)

    def _options(self) -> _EngineOptions:
        """Top logprobs and the reasoning gate (dropped once the thinking closed before a resume)."""
        gate = self.require_reasoning and not (self.ids and self.think_closed_in(self.ids))
        return {"top_logprobs_num": self.top_logprobs_num, "require_reasoning": gate}

    def think_closed_in(self, ids: list[int]) -> bool:
        """Whether ``ids`` hold the think-closing token."""
        return self.think_end_id is not None and self.think_end_id in ids

    def _add(
        self,
        ids: list[int],
        logprobs: list[float] | None,
        version: int,
        top: list[list[tuple[int, float]]] | None,
    ) -> None:
        if not ids:
            return
        if logprobs is None or len(logprobs) != len(ids):
            raise EngineError(f"engine request {self._current_rid} returned no logprobs for its tokens")
        if self.top_logprobs_num and (top is None or len(top) != len(ids)):
            raise EngineError(f"engine request {self._current_rid} returned no top logprobs for its tokens")
        self.ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(ids))
        if self.top_logprobs_num and top is not None:
            self.top.extend(top)

    async def abort(self) -> None:
        """Abort the current engine request (the client went away)."""
        if self.finish is None:
            await self._abort_current()

    async def cancel(self) -> None:
        """The client went away: abort the engine request; the generation ends as ``abort``."""
        self.cancelled = True
        await self.abort()
