"""The shared, dialect-blind path of one model call: from an HTTP request to a recorded turn.

:class:`TurnHandler` serves every dialect's generate route the same way: authenticate the session
token, read the body (bounded), let the dialect parse it into a
:class:`~dressage.proxy.conversation.Conversation`, answer a retried request from the log (same
body fingerprint or ``Idempotency-Key``) or, in a resumed session, from the recorded turn it
replays (:mod:`dressage.proxy.replay`), plan the prompt ids (TITO), generate, record the turn
durably, and only then hand the recorded turn to the dialect to render. Streaming follows the same
line: the generation runs in its own task, stable text leaves as the engine produces it, and the
turn is recorded before the dialect's last events.

Several choices (``n > 1``): the engine requests of all choices run concurrently; their turns are
recorded in choice order (see :mod:`dressage.proxy.recording`), and a stream sends choice 0 as it
is generated, then each further choice (by then mostly generated) before the end of the stream.

**Token rule:** when the URL carries a token (``/s/<token>/...``) it is the session's token and
headers are ignored (clients always send some key); without a URL token the dialect's header
carries it. A token that is unknown, or whose session is finished, gets 401 and nothing is
recorded; a token only ever reaches its own session's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from dressage.engines.protocol import FinishReason
from dressage.errors import ContextLengthExceededError, DressageError
from dressage.proxy.contract import TurnRequest
from dressage.proxy.conversation import Conversation
from dressage.proxy.dialects.base import Dialect, StreamRenderer
from dressage.proxy.errors import OverloadedError, PayloadTooLargeError, classify, error_message
from dressage.proxy.recording import (
    TurnJob,
    copy_from_parent,
    prepare_turn,
    record_overflow,
    record_turn,
    sibling_job,
)
from dressage.proxy.replay import ids_digest
from dressage.proxy.replies import parse_reply, reply_parse, reply_text, think_open
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.service import ProxyService
from dressage.proxy.sessions import SessionState
from dressage.proxy.streaming import IncrementalDecoder, StreamSplitter
from dressage.tito import TitoPlan
from dressage.tito.tool_calls import ParsedAssistant

log = logging.getLogger("dressage.proxy")

EarlyPlan = tuple[TitoPlan | None, float]
"""A request's plan made while its session's fence was checked (None: redo it), and its seconds."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than ``limit`` bytes (413) without reading it all first."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(limit)
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise PayloadTooLargeError(limit)
        parts.append(part)
    return b"".join(parts)


def _sse_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(extra or {})}


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _matched(job: TurnJob) -> str | None:
    finish = job.generation.finish
    return finish.matched if finish is not None and isinstance(finish.matched, str) else None


class TurnHandler:
    """Serves generate requests of every dialect for one :class:`ProxyService`."""

    def __init__(self, svc: ProxyService) -> None:
        self.svc = svc
        self._background: set[asyncio.Future[None]] = set()

    def _error(self, dialect: Dialect, exc: BaseException, stream: bool) -> Response:
        status, _, _, code = classify(exc)
        self.svc.metrics.errors.labels(str(status), str(code)).inc()
        self.svc.metrics.requests.labels(str(stream).lower(), "error").inc()
        response = dialect.error_response(exc, self.svc.secrets)
        if isinstance(exc, OverloadedError):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    async def authenticate(self, request: Request, dialect: Dialect) -> SessionState:
        """The live session of the request's token (401 otherwise)."""
        return await self.svc.registry.authenticate(dialect.token(request))

    async def handle(self, request: Request, dialect: Dialect) -> Response:
        """One generate request of ``dialect``, answered after its turn is durable.

        Admission control (:mod:`dressage.proxy.admission`) counts the request as active from here
        until its generation starts, and again from the end of its generation until it is answered;
        under overload it waits in the admission queue or is refused (503) before any work.
        """
        started = time.perf_counter()
        svc = self.svc
        stream = False
        try:
            await svc.admission.enter()
        except OverloadedError as e:
            return self._error(dialect, e, stream)
        active = True  # counted by admission control (not while the engine generates)
        try:
            state, conv, plan, raw = await self._admit(request, dialect)
            stream = conv.stream
            idem = request.headers.get("idempotency-key") or None
            recorded = await self._from_log(dialect, state, conv, idem)
            if recorded is not None:
                return recorded
            turn_index = state.next_turn
            job = await self._prepare(state, conv, idem, started, plan)
            boundary = await self._boundary(state, dialect, turn_index, raw, job)
            jobs = [job, *(sibling_job(job, i) for i in range(1, conv.n))]
            future = self._register(state, job)
            sized = {"x-dressage-prompt-tokens": str(len(job.prompt_ids))}
            if stream:
                renderers = dialect.renderers(conv, job.generation.rid, int(time.time()), len(job.prompt_ids))
                body = self._stream(jobs, renderers, future, boundary)
                svc.admission.leave()  # the stream counts itself again to record (see _stream)
                active = False
                return StreamingResponse(body, media_type="text/event-stream", headers=_sse_headers(sized))
            svc.admission.leave()
            active = False
            try:
                generated = await self._generate_unless_gone(request, jobs)
                svc.admission.rejoin()
                active = True
                if not generated:
                    self._fail(job, future, asyncio.CancelledError())
                    return Response(status_code=499)  # nobody reads it: the client went away
                reply = await self._record_choices(jobs)
            except BaseException as e:
                self._fail(job, future, e)
                raise
            future.set_result(reply)
            self._unregister(job)
            if boundary is not None:
                await boundary  # the agent gets its reply once its sandbox's checkpoint is taken
            body_json = dialect.respond(conv, reply, reply_parse(svc.profile, conv, reply))
            overhead = self._observe(job, reply, stream=False)
            headers = {
                "x-dressage-turn-id": reply.turn_id,
                "x-dressage-overhead-ms": f"{overhead * 1000:.3f}",
                **sized,
                **dialect.headers(reply),
            }
            return JSONResponse(body_json, headers=headers)
        except DressageError as e:
            return self._error(dialect, e, stream)
        finally:
            if active:
                svc.admission.leave()

    async def _from_log(
        self, dialect: Dialect, state: SessionState, conv: Conversation, idem: str | None
    ) -> Response | None:
        """The answer from the log, when there is one: a resumed session's replayed turn, a retried
        request's recorded reply, or a fork's copy of its parent's turn; None: generate."""
        svc, stream = self.svc, str(conv.stream).lower()
        if (
            state.replay is not None
            and (replayed := state.replay.match(state.index, state.replies, conv)) is not None
        ):
            svc.metrics.replayed.inc()
            svc.metrics.replayed_tokens.inc(sum(len(c.generated_ids) for c in replayed.choices))
            svc.metrics.requests.labels(stream, "replayed").inc()
            return self._replay(dialect, conv, replayed, header="resume")
        prior = state.lookup(conv.fingerprint, idem)
        if isinstance(prior, asyncio.Future):
            await asyncio.wait([prior])  # the original's outcome; its own cancellation is not ours
            # An original whose client went away is no reply: this retry generates anew.
            prior = None if prior.cancelled() else prior.result()
        if prior is not None:
            svc.metrics.dedupe.inc()
            svc.metrics.requests.labels(stream, "deduplicated").inc()
            return self._replay(dialect, conv, prior)
        if state.fork is not None and state.fork.pending(state.next_turn):
            copied = await copy_from_parent(svc.store, svc.registry, state, conv)
            if copied is not None:
                svc.metrics.replayed.inc()
                svc.metrics.replayed_tokens.inc(sum(len(c.generated_ids) for c in copied.choices))
                svc.metrics.requests.labels(stream, "replayed").inc()
                return self._replay(dialect, conv, copied, header="fork")
        return None

    async def _admit(
        self, request: Request, dialect: Dialect
    ) -> tuple[SessionState, Conversation, EarlyPlan, bytes]:
        """The request's session, conversation and (usually) its plan, with the session's fence
        checked while the body is read, parsed and planned (see :mod:`dressage.proxy.sessions`).

        A 401 wins over a bad body, as when the fence was checked first. The plan is None when
        planning failed (it is redone, and its error raised, in :meth:`_prepare`) or waits for a
        resumed session's replay or a fork's copy.
        """
        svc = self.svc
        token = dialect.token(request)
        state, fence = await svc.registry.begin(token)
        try:
            raw = await read_body(request, svc.settings.max_request_bytes)
            conv = dialect.parse(raw, state, svc.default_sampling)
        except DressageError:
            await svc.registry.confirm(token, state, fence)
            raise
        plan = self._plan_early(state, conv)
        fresh = await svc.registry.confirm(token, state, fence)
        if fresh is not state:  # another proxy moved the session on: start again on the log's state
            conv = dialect.parse(raw, fresh, svc.default_sampling)
            plan = self._plan_early(fresh, conv)
        return fresh, conv, plan, raw

    async def _boundary(
        self, state: SessionState, dialect: Dialect, turn_index: int, raw: bytes, job: TurnJob
    ) -> asyncio.Future[None] | None:
        """A live request's turn boundary: a session started from a checkpoint checks its first
        request against the one recorded there (:mod:`dressage.proxy.checkpoint_start`), and the
        session's turn hook, if any, starts (its owner checkpoints the sandbox meanwhile)."""
        svc = self.svc
        expected = state.checkpoint_start
        if expected is None and not svc.watched(state.session_id):
            return None
        digest = ids_digest(job.prompt_ids)
        if expected is not None and expected.pending(turn_index):
            await expected.check(svc.store, state, turn_index, digest)
        return svc.turn_boundary(state.session_id, TurnRequest(turn_index, dialect.name, raw, digest))

    @staticmethod
    def _plan_early(state: SessionState, conv: Conversation) -> EarlyPlan:
        if state.replay is not None or state.fork is not None:  # answered from the log first
            return None, 0.0
        t0 = time.perf_counter()
        try:
            return state.index.plan(conv.messages, conv.tools, conv.enable_thinking), time.perf_counter() - t0
        except DressageError:
            return None, 0.0

    async def _prepare(
        self, state: SessionState, conv: Conversation, idem: str | None, started: float, early: EarlyPlan
    ) -> TurnJob:
        svc = self.svc
        plan, plan_seconds = early
        window = await svc.context_window()
        try:
            job = prepare_turn(
                state,
                conv,
                plan=plan,
                coordinator=svc.coordinator,
                client=svc.pool.client_for(state.session_id),
                context_window=window,
                record_experts=svc.record_experts,
                idem_key=idem,
                started=started,
                default_max_tokens=svc.settings.default_max_tokens,
            )
        except ContextLengthExceededError:
            n = state.index.plan(conv.messages, conv.tools, conv.enable_thinking).prompt_len
            await record_overflow(svc.store, state, "prompt", {"prompt_tokens": n, "context_window": window})
            raise
        job.plan_seconds += plan_seconds  # planned while the session's fence was checked
        svc.metrics.plan.observe(job.plan_seconds)
        return job

    async def _generate_unless_gone(self, request: Request, jobs: list[TurnJob]) -> bool:
        """Generate every choice (non-streaming) while watching the connection; False when the client left.

        A client that leaves gets its engine requests aborted and their partial turns recorded as
        dead ends (as a streaming client's are), instead of generating to the end for nobody. The
        choices generate concurrently; the first engine failure is raised once all have ended.
        """
        generating = [asyncio.ensure_future(j.generation.run()) for j in jobs]
        everything: asyncio.Future[Any] = asyncio.gather(*generating, return_exceptions=True)
        gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait([everything, gone], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._abandon(jobs, generating)
            raise
        finally:
            gone.cancel()
        if not everything.done():
            self._abandon(jobs, generating)
            return False
        for result in everything.result():
            if isinstance(result, BaseException):
                raise result
        return True

    # --- in-flight registry (a retry that arrives mid-generation waits for the original) ----------

    def _register(self, state: SessionState, job: TurnJob) -> asyncio.Future[ReplyData]:
        future: asyncio.Future[ReplyData] = asyncio.get_running_loop().create_future()
        keys = [f"fp:{job.conv.fingerprint}"] + ([f"idem:{job.idem_key}"] if job.idem_key else [])
        for key in keys:
            state.inflight[key] = future
        if job.idem_key:
            state.idem_fingerprints.setdefault(job.idem_key, job.conv.fingerprint)
        job.dedupe_keys = keys
        return future

    def _unregister(self, job: TurnJob) -> None:
        for key in job.dedupe_keys:
            job.state.inflight.pop(key, None)
        idem, state = job.idem_key, job.state
        if (
            idem
            and idem not in state.by_idem_key
            and state.idem_fingerprints.get(idem) == job.conv.fingerprint
        ):
            del state.idem_fingerprints[idem]  # no reply was recorded under it: the key is free again

    def _fail(self, job: TurnJob, future: asyncio.Future[ReplyData], exc: BaseException) -> None:
        if not future.done():
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()
            else:
                future.cancel()
        self._unregister(job)

    async def _record_choices(self, jobs: list[TurnJob]) -> ReplyData:
        """Record choice 0, then its siblings (branches at its prompt); choice 0's reply holds them all."""
        first = await self._record(jobs[0])
        for sibling in jobs[1:]:
            sibling.first_turn_index = first.turn_index
            await self._record(sibling)
        return first

    # --- recording --------------------------------------------------------------------------------

    async def _record(self, job: TurnJob) -> ReplyData:
        svc = self.svc

        def parse(turn_id: str) -> ParsedAssistant:
            text = reply_text(svc.profile, job.forced_ids, job.generation.ids, _matched(job))
            return parse_reply(svc.profile, job.conv, text, turn_id)

        t0 = time.perf_counter()
        reply = await record_turn(svc.store, svc.registry, job, parse, svc.secrets)
        svc.metrics.append.observe(time.perf_counter() - t0)
        return reply

    async def _record_abandoned(self, job: TurnJob, producer: asyncio.Future[None]) -> None:
        """The client went away mid-stream: abort the engine request, record what was generated.

        The engine's final (abort) chunk carries every token generated so far; the turn is
        recorded as a dead-end segment (``finish_reason`` ``abort`` unless the generation had
        already ended) and is never the reply to a retry, which generates anew.
        """
        gen = job.generation
        try:
            await gen.cancel()
            try:
                await producer
            except DressageError as e:  # the engine failed as well: record what it had generated
                log.warning("generation %s ended with an error: %s", gen.rid, e)
                if not gen.ids:
                    return
                gen.finish = gen.finish or FinishReason(type="abort", message="engine error")
            if gen.finish is None:
                return  # it never reached the engine: nothing was generated
            await record_turn(self.svc.store, self.svc.registry, job, None, self.svc.secrets, abandoned=True)
        except DressageError as e:
            log.warning("could not record the turn of %s abandoned by its client: %s", gen.rid, e)
            self.svc.metrics.errors.labels("499", "client_disconnected").inc()

    def _observe(self, job: TurnJob, reply: ReplyData, *, stream: bool) -> float:
        m = self.svc.metrics
        total = time.perf_counter() - job.started
        overhead = max(total - job.generation.engine_seconds, 0.0)
        m.latency.labels(str(stream).lower()).observe(total)
        m.overhead.observe(overhead)
        m.tokens.labels("prompt").inc(reply.prompt_tokens)
        m.tokens.labels("generated").inc(len(reply.generated_ids))
        m.requests.labels(str(stream).lower(), "ok").inc()
        if job.generation.resumes:
            m.resumes.inc(job.generation.resumes)
        m.sessions.set(self.svc.registry.live_count())
        return overhead

    # --- replies ----------------------------------------------------------------------------------

    def _replay(self, dialect: Dialect, conv: Conversation, reply: ReplyData, header: str = "1") -> Response:
        """The recorded reply of a retried request (or of a resumed session's replay), as it asks for.

        ``x-dressage-replayed`` says which: ``1`` for a retry, ``resume`` for a replayed turn,
        ``fork`` for a fork's copy of its parent's turn.
        """
        parsed = reply_parse(self.svc.profile, conv, reply)
        headers = {
            "x-dressage-turn-id": reply.turn_id,
            "x-dressage-replayed": header,
            **dialect.headers(reply),
        }
        if not conv.stream:
            return JSONResponse(dialect.respond(conv, reply, parsed), headers=headers)
        renderers = dialect.renderers(conv, reply.rid or reply.turn_id, reply.created, reply.prompt_tokens)
        events: list[bytes] = []
        for choice, renderer in zip(reply.choices, renderers, strict=True):
            choice_parsed = reply_parse(self.svc.profile, conv, choice)
            events += [
                *renderer.start(),
                *self._replay_alternatives(renderer, conv, choice),
                *renderer.delta(
                    choice_parsed.reasoning_content or "",
                    choice_parsed.content or "",
                    choice.generated_ids,
                    choice.logprobs,
                ),
                *renderer.finish(choice, choice_parsed, "", ""),
            ]

        async def replay() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        return StreamingResponse(replay(), media_type="text/event-stream", headers=_sse_headers(headers))

    @staticmethod
    def _replay_alternatives(renderer: StreamRenderer, conv: Conversation, reply: ReplyData) -> list[bytes]:
        if conv.top_logprobs and reply.top_logprobs is not None:
            renderer.alternatives(reply.top_logprobs)
        return []

    async def _stream(
        self,
        jobs: list[TurnJob],
        renderers: list[StreamRenderer],
        future: asyncio.Future[ReplyData],
        boundary: asyncio.Future[None] | None = None,
    ) -> AsyncIterator[bytes]:
        """SSE body: text as the engine produces it, each turn recorded before its last events.

        Events leave in as few writes as keep them prompt: a choice's opening events go with its
        first text, and the text of a generation that has already ended goes with the finish events
        (right after the durable append). Every generation runs in its own task, so a client that goes away (this generator is
        cancelled or closed) does not lose tokens: :meth:`_record_abandoned` aborts the engine
        requests not yet recorded and records their partial turns.
        """
        svc = self.svc
        progress = [asyncio.Event() for _ in jobs]

        async def produce(job: TurnJob, event: asyncio.Event) -> None:
            try:
                async for _ in job.generation.stream():
                    event.set()
            finally:
                event.set()

        producers = [asyncio.create_task(produce(j, e)) for j, e in zip(jobs, progress, strict=True)]
        recorded = claimed = 0  # turns recorded / whose recording has started
        first: ReplyData | None = None
        renderer = renderers[0]
        held = b""  # events that leave with the next ones (fewer writes; see below)
        try:
            for i, (job, renderer) in enumerate(zip(jobs, renderers, strict=True)):
                held += b"".join(renderer.start())  # leaves with the first text
                splitter, text_events = self._choice_text(job, renderer, producers[i], progress[i])
                async for event in text_events:
                    held += event
                    if not producers[i].done():  # once generation ended, the rest waits for the finish
                        yield held
                        held = b""
                if first is not None:
                    job.first_turn_index = first.turn_index
                record = asyncio.ensure_future(self._record(job))
                claimed += 1
                svc.admission.rejoin()  # recording is the proxy's own work again
                try:
                    reply = await asyncio.shield(record)  # a client leaving now does not cut the append
                finally:
                    svc.admission.leave()
                recorded += 1
                first = first or reply
                if recorded == len(jobs):
                    future.set_result(first)
                    self._unregister(jobs[0])
                parsed = reply_parse(svc.profile, job.conv, reply)
                reasoning, content = splitter.finish(parsed.reasoning_content, parsed.content)
                events = renderer.finish(reply, parsed, reasoning, content)
                if recorded == len(jobs):
                    self._observe(jobs[0], first, stream=True)
                    if boundary is not None:
                        await boundary  # the reply's last events wait for the sandbox's checkpoint
                if held := held + b"".join(events):
                    yield held
                    held = b""
        except Exception as e:  # ours or the engine's: the stream still ends with an error event
            self._fail(jobs[0], future, e)
            self._abandon(jobs[claimed:], producers[claimed:])  # generated tokens are recorded
            status, _, _, code = classify(e)
            svc.metrics.errors.labels(str(status), str(code)).inc()
            yield held + b"".join(renderer.error(e, error_message(e, svc.secrets)))
        except BaseException as e:  # the client went away (cancellation) or a bug
            self._fail(jobs[0], future, e)
            self._abandon(jobs[claimed:], producers[claimed:])
            raise

    def _abandon(self, jobs: Sequence[TurnJob], producers: Sequence[asyncio.Future[None]]) -> None:
        """Record the partial turns of choices nobody will receive (in the background)."""
        for job, producer in zip(jobs, producers, strict=True):
            task = asyncio.ensure_future(self._record_abandoned(job, producer))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _choice_text(
        self, job: TurnJob, renderer: StreamRenderer, producer: asyncio.Task[None], progress: asyncio.Event
    ) -> tuple[StreamSplitter, AsyncIterator[bytes]]:
        """One choice's splitter and its text events until its generation ends (engine errors raised)."""
        profile, conv, gen = self.svc.profile, job.conv, job.generation
        stops = set(profile.stop_token_ids)
        decoder = IncrementalDecoder(profile.tokenizer)
        splitter = StreamSplitter(
            think_open(profile, conv),
            conv.parse_tools and profile.tool_call_marker is not None,
            conv.sampling.get("stop") or (),
            profile.tool_call_marker or "",
            profile.has_reasoning,
        )

        async def events() -> AsyncIterator[bytes]:
            seen = 0
            if job.forced_text:
                splitter.push(job.forced_text)  # held back: tool calls leave whole, at the end
            while True:
                await progress.wait()
                progress.clear()
                new = gen.ids[seen:]
                new_lp = gen.logprobs[seen : seen + len(new)]
                seen += len(new)
                text = decoder.feed([i for i in new if i not in stops])
                reasoning, content = splitter.push(text) if text else ("", "")
                if conv.top_logprobs and new:
                    renderer.alternatives(gen.top[seen - len(new) : seen])
                if events := b"".join(renderer.delta(reasoning, content, list(new), list(new_lp))):
                    yield events
                if producer.done() and seen >= len(gen.ids):
                    break
            producer.result()  # the engine's errors

        return splitter, events()
