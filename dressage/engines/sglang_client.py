"""Async client for an engine speaking SGLang's native HTTP protocol (SGLang itself or the dev engine).

:class:`EngineClient` talks to one engine; :class:`EnginePool` spreads sessions over several,
keeping each session on one engine (so its prefix cache stays warm) and broadcasting the control
operations a weight update needs (pause, update, continue). ``/generate`` (every turn) goes
through the lean HTTP/1.1 client of :mod:`dressage.engines.http1` with its ids encoded once
(:mod:`dressage.engines.ids_json`); the control operations, rare, through httpx (and ``https``
engines wholly). Transport errors of both are translated here, at one seam, into
:class:`~dressage.errors.EngineError` naming the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, TypedDict, Unpack

import httpx
import numpy as np
import orjson

from dressage.config import ENGINE_CONNECT_TIMEOUT_S
from dressage.engines.http1 import ConnectionPool, Exchange, TransportError
from dressage.engines.ids_json import IdsJson
from dressage.engines.protocol import (
    SSE_DONE,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    PauseMode,
    SamplingParams,
    UpdateWeightsFromDiskResponse,
    WeightVersionSpan,
    decode_routed_experts,
    engine_weight_version,
)
from dressage.errors import EngineBroadcastError, EngineError, EngineHTTPError
from dressage.tls import tls_context

_JSON = {"content-type": "application/json"}

TopLogprobs = list[list[tuple[int, float]]]
"""Per output token, the ``(token_id, logprob)`` alternatives the engine reported, best first."""


class GenerateOptions(TypedDict, total=False):
    """The keyword options of one generation, shared by :meth:`EngineClient.generate`,
    :meth:`EngineClient.generate_stream` and their :class:`EnginePool` forms (see
    :meth:`EngineClient.generate` for each; unset: ``return_logprob`` on, the others off)."""

    return_logprob: bool
    return_routed_experts: bool
    routed_experts_start_len: int
    top_logprobs_num: int
    require_reasoning: bool


def _top_entries(rows: list[list[tuple[float | None, int, str | None]] | None]) -> TopLogprobs:
    return [
        [(int(e[1]), float(e[0]) if e[0] is not None else float("-inf")) for e in row or ()] for row in rows
    ]


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """A finished (or aborted) generation: the sampled ids are ground truth."""

    rid: str
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    prompt_tokens: int
    weight_version: str | None
    weight_versions: list[WeightVersionSpan]
    routed_experts: np.ndarray | None  # int32 [prompt + output - 1 - start, layers, top_k]
    text: str | None
    top_logprobs: TopLogprobs | None = None

    @property
    def aborted(self) -> bool:
        """Whether the engine ended it early (abort request, pause, weight update)."""
        return self.finish_reason.type == "abort"


@dataclasses.dataclass(frozen=True)
class GenerateDelta:
    """The tokens one stream chunk added; the last delta carries the finish reason."""

    rid: str
    output_ids: list[int]
    logprobs: list[float] | None
    completion_tokens: int  # running total
    weight_version: str | None
    finish_reason: FinishReason | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    routed_experts: np.ndarray | None = None
    top_logprobs: TopLogprobs | None = None

    @property
    def finished(self) -> bool:
        """Whether this is the last delta of the request."""
        return self.finish_reason is not None


ENGINE_POOL = httpx.Limits(max_connections=4096, max_keepalive_connections=4096, keepalive_expiry=4.0)
"""Connections to one engine: as many kept open as requests run at once (an engine batches thousands).

httpx's default keeps 20 of at most 100: at 1,000 concurrent sessions (``bench/scale.py``) a proxy
queued requests behind 100 connections and opened and closed a TCP connection for most of the rest;
on a starved event loop some of those connects overran their 10 s timeout and turns failed with
HTTP 502 ("engine ... is unreachable"). An idle connection expires after 4 s, before SGLang's
uvicorn (5 s keep-alive) closes it, so a request is not sent on a connection the engine is closing.
"""


class EngineClient:
    """One engine at ``base_url`` (e.g. ``http://127.0.0.1:30000``).

    ``routed_experts_shape`` is ``(num_layers, top_k)``; when not given it is read from
    ``/model_info`` (the dev engine reports it; for SGLang pass it from the model config).
    ``connect_timeout`` bounds opening a connection (``Settings.engine_connect_timeout_s``),
    ``timeout`` every read (a generation streams within it).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = ENGINE_CONNECT_TIMEOUT_S,
        routed_experts_shape: tuple[int, int] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=ENGINE_POOL,
            verify=tls_context(),
        )
        url = httpx.URL(self.base_url)
        self._lean = (
            ConnectionPool(
                url.host,
                url.port or 80,
                connect_timeout=connect_timeout,
                read_timeout=timeout,
                keepalive_expiry=ENGINE_POOL.keepalive_expiry or 4.0,
                max_connections=ENGINE_POOL.max_connections or 4096,
            )
            if url.scheme == "http"
            else None
        )
        self._generate_path = url.path.rstrip("/") + "/generate"
        self._ids_json = IdsJson()
        self._experts_shape = routed_experts_shape

    async def aclose(self) -> None:
        """Close the connection pools."""
        await self._http.aclose()
        if self._lean is not None:
            await self._lean.aclose()

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- generation ---------------------------------------------------------------------------

    def _request(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams | None,
        rid: str | None,
        *,
        stream: bool,
        return_logprob: bool = True,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        top_logprobs_num: int = 0,
        require_reasoning: bool = False,
    ) -> bytes:
        """The ``/generate`` body: the ids' JSON (encoded once per id, see ids_json) and the rest.

        The keyword defaults are those of :class:`GenerateOptions` (the one place they are set).
        """
        if routed_experts_start_len < 0 or routed_experts_start_len > len(input_ids):
            raise ValueError(
                f"routed_experts_start_len must be in [0, len(input_ids)={len(input_ids)}], "
                f"got {routed_experts_start_len}"
            )
        body = GenerateRequest(
            rid=rid,
            sampling_params=sampling or SamplingParams(),
            return_logprob=return_logprob,
            return_routed_experts=return_routed_experts,
            routed_experts_start_len=routed_experts_start_len,
            top_logprobs_num=top_logprobs_num or None,
            require_reasoning=require_reasoning or None,
            stream=stream,
        ).to_body()
        # The ids (tens of thousands) skip pydantic and are spliced in as JSON text.
        rest = orjson.dumps(body)
        return (
            b'{"input_ids":' + self._ids_json.array(input_ids) + (b"," + rest[1:] if len(rest) > 2 else b"}")
        )

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        rid: str | None = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerateResult:
        """Generate to completion. An abort is a result (``aborted``) carrying the partial output.

        With ``return_routed_experts``, ``routed_experts_start_len`` (SGLang's field) skips the
        routing of the first positions: rows start at that position, so a caller that already
        holds the routing of a prompt prefix asks only for the new positions.
        ``top_logprobs_num`` > 0 (with ``return_logprob``) fills ``top_logprobs``;
        ``require_reasoning`` defers a grammar until the output closes its thinking block.
        ``return_logprob`` (default on) fills ``logprobs``.
        """
        body = self._request(input_ids, sampling, rid, stream=False, **options)
        data = await self._generate_json(body)
        response = self._parse(GenerateResponse, data, "/generate")
        meta = response.meta_info
        if meta.finish_reason is None:
            raise EngineError(
                f"engine at {self.base_url} returned an unfinished non-streaming response for rid {meta.id}"
            )
        logprobs = (
            [float(e[0]) for e in meta.output_token_logprobs]
            if meta.output_token_logprobs is not None
            else None
        )
        experts = None
        if meta.routed_experts is not None:
            experts = await self._decode_experts(meta.routed_experts)
        return GenerateResult(
            rid=meta.id,
            output_ids=response.output_ids,
            logprobs=logprobs,
            finish_reason=meta.finish_reason,
            prompt_tokens=meta.prompt_tokens,
            weight_version=meta.weight_version,
            weight_versions=meta.weight_versions or [],
            routed_experts=experts,
            text=response.text,
            top_logprobs=(
                _top_entries(meta.output_top_logprobs) if meta.output_top_logprobs is not None else None
            ),
        )

    async def generate_stream(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        rid: str | None = None,
        **options: Unpack[GenerateOptions],
    ) -> AsyncIterator[GenerateDelta]:
        """Stream a generation as incremental deltas, whether the server streams cumulatively
        (SGLang's default) or incrementally (``--incremental-streaming-output``).
        Other arguments as in :meth:`generate` (routed experts come with the last delta)."""
        body = self._request(input_ids, sampling, rid, stream=True, **options)
        seen = 0
        done = False
        # Read to the body's end (past [DONE]) so the connection goes back to the pool.
        async with contextlib.aclosing(self._generate_events(body)) as events:
            async for payload in events:
                done = done or payload == SSE_DONE
                if done:
                    continue
                delta = await self._delta(orjson.loads(payload), seen)
                seen = delta.completion_tokens
                yield delta

    async def _generate_json(self, body: bytes) -> Any:
        """``POST /generate`` without streaming: the answer's JSON."""
        if self._lean is None:
            return await self._post_json("/generate", body)
        try:
            async with self._lean.exchange("POST", self._generate_path, body) as ex:
                data = await ex.read()
                self._raise_lean_status(ex, data)
        except TransportError as e:
            raise self._unreachable("/generate", e) from e
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise EngineError(f"engine at {self.base_url}/generate answered non-JSON: {data[:200]!r}") from e

    async def _generate_events(self, body: bytes) -> AsyncGenerator[str, None]:
        """``POST /generate`` streaming: the data of each server-sent event as it arrives."""
        try:
            if self._lean is None:
                async with self._http.stream("POST", "/generate", content=body, headers=_JSON) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        self._raise_status(resp, "/generate")
                    async for line in resp.aiter_lines():
                        if line.startswith("data:"):
                            yield line[len("data:") :].strip()
                return
            async with self._lean.exchange("POST", self._generate_path, body) as ex:
                if ex.status >= 400:
                    self._raise_lean_status(ex, await ex.read())
                async for raw in ex.lines():
                    if raw.startswith(b"data:"):
                        yield raw[len(b"data:") :].strip().decode()
        except (httpx.HTTPError, TransportError) as e:
            raise self._unreachable("/generate", e) from e

    def _raise_lean_status(self, ex: Exchange, data: bytes) -> None:
        if ex.status >= 400:
            self._raise_status(httpx.Response(ex.status, content=data), "/generate")

    async def _delta(self, data: dict[str, Any], seen: int) -> GenerateDelta:
        if "error" in data:
            raise EngineError(f"engine at {self.base_url} reported a stream error: {data['error']}")
        chunk = self._parse(GenerateResponse, data, "/generate stream")
        meta = chunk.meta_info
        total = meta.completion_tokens
        cumulative = len(chunk.output_ids) == total
        new_ids = chunk.output_ids[seen:] if cumulative else chunk.output_ids
        logprobs = None
        if meta.output_token_logprobs is not None:
            entries = meta.output_token_logprobs
            if len(entries) == total:  # cumulative, like output_ids
                entries = entries[seen:]
            logprobs = [float(e[0]) for e in entries]
        top = None
        if meta.output_top_logprobs is not None:
            rows = meta.output_top_logprobs
            top = _top_entries(rows[seen:] if len(rows) == total else rows)
        experts = await self._decode_experts(meta.routed_experts) if meta.routed_experts is not None else None
        return GenerateDelta(
            rid=meta.id,
            output_ids=list(new_ids),
            logprobs=logprobs,
            completion_tokens=total,
            weight_version=meta.weight_version,
            finish_reason=meta.finish_reason,
            weight_versions=meta.weight_versions,
            routed_experts=experts,
            top_logprobs=top,
        )

    async def _decode_experts(self, data: str) -> np.ndarray:
        if self._experts_shape is None:
            info = await self.model_info()
            if not (info.num_layers and info.top_k):
                raise EngineError(
                    f"engine at {self.base_url} does not report num_layers/top_k in /model_info; "
                    "pass routed_experts_shape=(num_layers, top_k) from the model config"
                )
            self._experts_shape = (info.num_layers, info.top_k)
        try:
            return decode_routed_experts(data, *self._experts_shape)
        except ValueError as e:
            raise EngineError(f"engine at {self.base_url} sent undecodable routed_experts: {e}") from e

    # --- control ------------------------------------------------------------------------------

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort one request (or all): it finishes with ``finish_reason.type == "abort"``."""
        await self._post_json("/abort_request", {"rid": rid, "abort_all": abort_all}, expect_json=False)

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Pause generation (``abort`` ends in-flight requests; ``in_place``/``retract`` hold them)."""
        await self._post_json("/pause_generation", {"mode": mode})

    async def continue_(self) -> None:
        """Resume generation after :meth:`pause`."""
        await self._post_json("/continue_generation", {})

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | int | None = None, *, abort_all_requests: bool = False
    ) -> UpdateWeightsFromDiskResponse:
        """Load new weights from a path on the engine's machine; raises when the engine refuses."""
        body: dict[str, Any] = {"model_path": model_path, "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = engine_weight_version(weight_version)
        data = await self._post_json("/update_weights_from_disk", body)
        return self._parse(UpdateWeightsFromDiskResponse, data, "/update_weights_from_disk")

    async def model_info(self) -> ModelInfo:
        """``GET /model_info``: model path, weight version, and (dev engine) routing shape."""
        try:
            resp = await self._http.get("/model_info")
        except httpx.HTTPError as e:
            raise self._unreachable("/model_info", e) from e
        self._raise_status(resp, "/model_info")
        return self._parse(ModelInfo, resp.json(), "/model_info")

    async def health(self) -> bool:
        """Whether ``GET /health`` answers 200 (never raises)."""
        try:
            resp = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    # --- plumbing -----------------------------------------------------------------------------

    async def _post_json(self, path: str, body: dict[str, Any] | bytes, *, expect_json: bool = True) -> Any:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        try:
            resp = await self._http.post(path, content=content, headers=_JSON)
        except httpx.HTTPError as e:
            raise self._unreachable(path, e) from e
        self._raise_status(resp, path)
        if not expect_json or not resp.content:
            return None
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError as e:
            raise EngineError(
                f"engine at {self.base_url}{path} answered non-JSON: {resp.text[:200]!r}"
            ) from e

    def _raise_status(self, resp: httpx.Response, path: str) -> None:
        if resp.status_code < 400:
            return
        try:
            detail = resp.json()
        except ValueError:
            detail = resp.text[:500]
        hint = (
            "the request was refused; check its fields"
            if resp.status_code < 500
            else "check the engine's log"
        )
        raise EngineHTTPError(
            f"engine at {self.base_url}{path} answered HTTP {resp.status_code}: {detail} ({hint})",
            status_code=resp.status_code,
        )

    def _unreachable(self, path: str, e: httpx.HTTPError | TransportError) -> EngineError:
        return EngineError(
            f"engine at {self.base_url}{path} is unreachable "
            f"({e if isinstance(e, TransportError) else f'{type(e).__name__}: {e}'}); "
            "check that the engine is running and the URL is right"
        )

    def _parse(self, model: Any, data: Any, what: str) -> Any:
        try:
            return model.model_validate(data)
        except ValueError as e:
            raise EngineError(f"engine at {self.base_url} sent an unexpected {what} answer: {e}") from e


class EnginePool:
    """Several engines behind one interface: session-sticky generation, broadcast control.

    A session key is assigned on first use to the healthy engine with the fewest sessions (ties:
    list order) and keeps it until :meth:`release` or until that engine is marked unhealthy.
    """

    def __init__(self, urls: list[str], **client_kwargs: Any) -> None:
        if not urls:
            raise EngineError("EnginePool needs at least one engine URL")
        self.clients = [EngineClient(u, **client_kwargs) for u in urls]
        self._by_url = {c.base_url: c for c in self.clients}
        self._sessions: dict[str, str] = {}
        self._unhealthy: set[str] = set()

    async def aclose(self) -> None:
        """Close every client."""
        await asyncio.gather(*(c.aclose() for c in self.clients))

    def client_for(self, session_key: str) -> EngineClient:
        """The engine a session is pinned to (assigned on first use)."""
        url = self._sessions.get(session_key)
        if url is not None and url not in self._unhealthy:
            return self._by_url[url]
        healthy = [c for c in self.clients if c.base_url not in self._unhealthy]
        if not healthy:
            raise EngineError(
                f"no healthy engine among {[c.base_url for c in self.clients]}; start one and call check_health()"
            )
        load = {c.base_url: 0 for c in healthy}
        for u in self._sessions.values():
            if u in load:
                load[u] += 1
        chosen = min(healthy, key=lambda c: load[c.base_url])
        self._sessions[session_key] = chosen.base_url
        return chosen

    def release(self, session_key: str) -> None:
        """Forget a finished session's pin."""
        self._sessions.pop(session_key, None)

    def mark_unhealthy(self, url: str) -> None:
        """Stop routing new work to ``url``; its sessions move on their next call."""
        self._unhealthy.add(url.rstrip("/"))

    async def check_health(self) -> dict[str, bool]:
        """Probe every engine and update the healthy set."""
        results = await asyncio.gather(*(c.health() for c in self.clients))
        self._unhealthy = {c.base_url for c, ok in zip(self.clients, results, strict=True) if not ok}
        return {c.base_url: ok for c, ok in zip(self.clients, results, strict=True)}

    async def generate(
        self,
        session_key: str,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        rid: str | None = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerateResult:
        """:meth:`EngineClient.generate` on the session's engine."""
        return await self.client_for(session_key).generate(input_ids, sampling, rid, **options)

    def generate_stream(
        self,
        session_key: str,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        rid: str | None = None,
        **options: Unpack[GenerateOptions],
    ) -> AsyncIterator[GenerateDelta]:
        """:meth:`EngineClient.generate_stream` on the session's engine."""
        return self.client_for(session_key).generate_stream(input_ids, sampling, rid, **options)

    async def abort(self, rid: str) -> None:
        """Abort ``rid`` wherever it runs (sent to every engine; unknown rids are ignored)."""
        await self._broadcast("abort", rid)

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Pause every engine."""
        await self._broadcast("pause", mode)

    async def continue_(self) -> None:
        """Resume every engine."""
        await self._broadcast("continue_")

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | int | None = None, **kwargs: Any
    ) -> None:
        """Load the same weights on every engine."""
        await self._broadcast("update_weights_from_disk", model_path, weight_version, **kwargs)

    async def _broadcast(self, method: str, *args: Any, **kwargs: Any) -> None:
        results = await asyncio.gather(
            *(getattr(c, method)(*args, **kwargs) for c in self.clients), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, EngineError):
                raise r
        failed = [
            (c.base_url, r) for c, r in zip(self.clients, results, strict=True) if isinstance(r, EngineError)
        ]
        if failed:
            raise EngineBroadcastError(
                f"{method} failed on {len(failed)} of {len(self.clients)} engines: "
                + "; ".join(f"{u}: {r}" for u, r in failed),
                failed,
            )
