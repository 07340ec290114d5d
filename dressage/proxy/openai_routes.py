"""The OpenAI surface: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Both are served at ``/v1/...`` (token in ``Authorization: Bearer``) and at ``/s/<token>/v1/...``
(token in the URL, so an unmodified OpenAI client works by setting ``base_url`` alone).
**Token rule:** when the URL carries a token it is the session's token and the ``Authorization``
header is ignored (OpenAI clients always send one, with whatever ``api_key`` they hold); without
a URL token the header must carry it. A token that is unknown, or whose session is finished, gets
401 and nothing is recorded; a token only ever reaches its own session's state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dressage.errors import ContextLengthExceededError, DressageError
from dressage.proxy.errors import PayloadTooLargeError, classify, error_body, error_response
from dressage.proxy.recording import TurnJob, prepare_turn, record_overflow, record_turn
from dressage.proxy.replies import (
    completion_body,
    finish_reason,
    logprobs_content,
    parse_reply,
    reply_parse,
    reply_text,
    think_open,
    usage,
)
from dressage.proxy.requests import ChatRequest, parse_chat_request
from dressage.proxy.service import ProxyService
from dressage.proxy.sessions import ReplyData, SessionState
from dressage.proxy.streaming import (
    IncrementalDecoder,
    StreamSplitter,
    chunk,
    sse,
    tool_call_deltas,
    usage_chunk,
)
from dressage.redact import redact
from dressage.tito.tool_calls import ParsedAssistant

log = logging.getLogger("dressage.proxy")


def request_token(request: Request) -> str | None:
    """The session token: from the URL when present (it wins), else the bearer header."""
    token = request.path_params.get("token")
    if token:
        return str(token)
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


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


class ChatHandler:
    """Handles chat completions for one :class:`ProxyService`."""

    def __init__(self, svc: ProxyService) -> None:
        self.svc = svc
        self._background: set[asyncio.Future[None]] = set()

    def _error(self, exc: BaseException, stream: bool) -> Response:
        status, _, _, code = classify(exc)
        self.svc.metrics.errors.labels(str(status), str(code)).inc()
        self.svc.metrics.requests.labels(str(stream).lower(), "error").inc()
        return error_response(exc, self.svc.secrets)

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        started = time.perf_counter()
        svc = self.svc
        stream = False
        try:
            state = await svc.registry.authenticate(request_token(request))
            raw = await read_body(request, svc.settings.max_request_bytes)
            req = parse_chat_request(raw, svc.default_sampling)
            stream = req.stream
            idem = request.headers.get("idempotency-key") or None
            prior = state.lookup(req.fingerprint, idem)
            if isinstance(prior, asyncio.Future):
                await asyncio.wait([prior])  # the original's outcome; its own cancellation is not ours
                # An original whose client went away is no reply: this retry generates anew.
                prior = None if prior.cancelled() else prior.result()
            if prior is not None:
                svc.metrics.dedupe.inc()
                svc.metrics.requests.labels(str(stream).lower(), "deduplicated").inc()
                return self._replay(req, prior)
            window = await svc.context_window()
            try:
                job = prepare_turn(
                    state,
                    req,
                    coordinator=svc.coordinator,
                    client=svc.pool.client_for(state.session_id),
                    context_window=window,
                    record_experts=svc.record_experts,
                    idem_key=idem,
                    started=started,
                )
            except ContextLengthExceededError:
                n = state.index.plan(req.messages, req.tools, req.enable_thinking).prompt_len
                await record_overflow(
                    svc.store, state, "prompt", {"prompt_tokens": n, "context_window": window}
                )
                raise
            svc.metrics.plan.observe(job.plan_seconds)
            future = self._register(state, job)
            if stream:
                return StreamingResponse(
                    self._stream(job, future), media_type="text/event-stream", headers=_sse_headers()
                )
            try:
                await job.generation.run()
                reply = await self._record(job)
            except BaseException as e:
                self._fail(job, future, e)
                raise
            future.set_result(reply)
            self._unregister(job)
            body, _ = completion_body(svc.profile, req, reply, svc.model_name)
            overhead = self._observe(job, reply, stream=False)
            return JSONResponse(
                body,
                headers={
                    "x-dressage-turn-id": reply.turn_id,
                    "x-dressage-overhead-ms": f"{overhead * 1000:.3f}",
                },
            )
        except DressageError as e:
            return self._error(e, stream)

    # --- in-flight registry (a retry that arrives mid-generation waits for the original) ----------

    def _register(self, state: SessionState, job: TurnJob) -> asyncio.Future[ReplyData]:
        future: asyncio.Future[ReplyData] = asyncio.get_running_loop().create_future()
        keys = [f"fp:{job.req.fingerprint}"] + ([f"idem:{job.idem_key}"] if job.idem_key else [])
        for key in keys:
            state.inflight[key] = future
        job.dedupe_keys = keys
        return future

    def _unregister(self, job: TurnJob) -> None:
        for key in job.dedupe_keys:
            job.state.inflight.pop(key, None)

    def _fail(self, job: TurnJob, future: asyncio.Future[ReplyData], exc: BaseException) -> None:
        if not future.done():
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()
            else:
                future.cancel()
        self._unregister(job)

    # --- recording --------------------------------------------------------------------------------

    async def _record(self, job: TurnJob) -> ReplyData:
        svc = self.svc

        def parse(turn_id: str) -> ParsedAssistant:
            text = reply_text(svc.profile, job.forced_ids, job.generation.ids, _matched(job))
            return parse_reply(svc.profile, job.req, text, turn_id)

        t0 = time.perf_counter()
        reply = await record_turn(svc.store, svc.registry, job, parse, svc.secrets)
        svc.metrics.append.observe(time.perf_counter() - t0)
        return reply

    async def _record_abandoned(self, job: TurnJob, producer: asyncio.Task[None]) -> None:
        """The client went away mid-stream: abort the engine request, record what was generated.

        The engine's final (abort) chunk carries every token generated so far; the turn is
        recorded as a dead-end segment (``finish_reason`` ``abort`` unless the generation had
        already ended) and is never the reply to a retry, which generates anew.
        """
        gen = job.generation
        try:
            await gen.cancel()
            await producer
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

    def _replay(self, req: ChatRequest, reply: ReplyData) -> Response:
        """The recorded reply of a retried request, in the form it asks for."""
        body, parsed = completion_body(self.svc.profile, req, reply, self.svc.model_name)
        headers = {"x-dressage-turn-id": reply.turn_id, "x-dressage-replayed": "1"}
        if not req.stream:
            return JSONResponse(body, headers=headers)
        cid, created, model = body["id"], body["created"], body["model"]
        msg = body["choices"][0]["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("reasoning_content") is not None:
            delta["reasoning_content"] = msg["reasoning_content"]
        lp = body["choices"][0]["logprobs"]
        events = [sse(chunk(cid, created, model, delta, logprobs=lp["content"] if lp else None))]
        if parsed.tool_calls:
            events.append(sse(chunk(cid, created, model, tool_call_deltas(parsed.tool_calls))))
        events.append(sse(chunk(cid, created, model, {}, body["choices"][0]["finish_reason"])))
        if req.include_usage:
            events.append(sse(usage_chunk(cid, created, model, body["usage"])))
        events.append(sse("[DONE]"))

        async def replay() -> AsyncIterator[bytes]:
            for event in events:
                yield event

        return StreamingResponse(replay(), media_type="text/event-stream", headers=_sse_headers(headers))

    async def _stream(self, job: TurnJob, future: asyncio.Future[ReplyData]) -> AsyncIterator[bytes]:
        """SSE body: deltas as the engine produces them, the turn recorded before the last chunk.

        The generation runs in its own task, so a client that goes away (this generator is
        cancelled) does not lose tokens: :meth:`_record_abandoned` aborts the engine request and
        records the partial turn.
        """
        svc, req, gen = self.svc, job.req, job.generation
        profile = svc.profile
        cid, created, model = f"chatcmpl-{gen.rid}", int(time.time()), svc.model_name
        stops = set(profile.stop_token_ids)
        decoder = IncrementalDecoder(profile.tokenizer)
        splitter = StreamSplitter(
            think_open(profile, req),
            req.parse_tools and profile.tool_call_marker is not None,
            req.sampling.get("stop") or (),
            profile.tool_call_marker or "",
        )
        progress = asyncio.Event()

        async def produce() -> None:
            try:
                async for _ in gen.stream():
                    progress.set()
            finally:
                progress.set()

        producer = asyncio.create_task(produce())
        record: asyncio.Future[ReplyData] | None = None
        seen = 0
        try:
            yield sse(chunk(cid, created, model, {"role": "assistant", "content": ""}))
            if job.forced_text:
                splitter.push(job.forced_text)  # held back: tool calls leave whole, at the end
            while True:
                await progress.wait()
                progress.clear()
                new = gen.ids[seen:]
                lp = (
                    logprobs_content(profile, new, gen.logprobs[seen : seen + len(new)])
                    if req.logprobs and new
                    else None
                )
                seen += len(new)
                text = decoder.feed([i for i in new if i not in stops])
                reasoning, content = splitter.push(text) if text else ("", "")
                delta: dict[str, Any] = {}
                if reasoning:
                    delta["reasoning_content"] = reasoning
                if content:
                    delta["content"] = content
                if delta or lp:
                    yield sse(chunk(cid, created, model, delta, logprobs=lp))
                if producer.done() and seen >= len(gen.ids):
                    break
            producer.result()  # the engine's errors
            record = asyncio.ensure_future(self._record(job))
            reply = await asyncio.shield(record)  # a client leaving now does not cut the append
            future.set_result(reply)
            self._unregister(job)
            parsed = reply_parse(profile, req, reply)
            reasoning, content = splitter.finish(parsed.reasoning_content, parsed.content)
            delta = {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v}
            if delta:
                yield sse(chunk(cid, created, model, delta))
            if parsed.tool_calls:
                yield sse(chunk(cid, created, model, tool_call_deltas(parsed.tool_calls)))
            yield sse(chunk(cid, created, model, {}, finish_reason(reply.stop_reason, parsed)))
            if req.include_usage:
                yield sse(
                    usage_chunk(cid, created, model, usage(reply.prompt_tokens, len(reply.generated_ids)))
                )
            self._observe(job, reply, stream=True)
            yield sse("[DONE]")
        except DressageError as e:
            self._fail(job, future, e)
            status, type_, param, code = classify(e)
            svc.metrics.errors.labels(str(status), str(code)).inc()
            yield sse(error_body(redact(str(e), svc.secrets) or "", type_, param, code))
        except BaseException as e:  # the client went away (cancellation) or a bug
            self._fail(job, future, e)
            if record is None:
                task = asyncio.ensure_future(self._record_abandoned(job, producer))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model this proxy serves."""
        try:
            await self.svc.registry.authenticate(request_token(request))
        except DressageError as e:
            return self._error(e, False)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.svc.model_name, "object": "model", "created": 0, "owned_by": "dressage"}
                ],
            }
        )


def _matched(job: TurnJob) -> str | None:
    finish = job.generation.finish
    return finish.matched if finish is not None and isinstance(finish.matched, str) else None


def openai_routes(svc: ProxyService) -> list[Route]:
    """The OpenAI routes, under ``/v1`` and ``/s/{token}/v1``."""
    handler = ChatHandler(svc)
    routes = []
    for prefix in ("/v1", "/s/{token}/v1"):
        routes.append(Route(f"{prefix}/chat/completions", handler.chat, methods=["POST"]))
        routes.append(Route(f"{prefix}/models", handler.models, methods=["GET"]))
    return routes
