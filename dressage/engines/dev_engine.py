"""The CPU dev engine: SGLang's native HTTP protocol served from a transformers model.

It lets the proxy, rollout workers and tests run on a laptop against the same wire protocol as a
GPU SGLang server (see :mod:`dressage.engines.protocol` for the facts pinned). Routes:
``/generate`` (JSON or SSE), ``/abort_request``, ``/pause_generation``, ``/continue_generation``,
``/update_weights_from_disk``, ``/update_weight_version``, ``/model_info``, ``/health``.

Differences from SGLang, on purpose: requests without ``sampling_seed`` are still deterministic
(seeded from the engine seed and the rid); routed experts are always capturable (no server flag);
input-token logprobs (``logprob_start_len >= 0``), top logprobs and batched requests are refused
with 400.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dressage.engines.dev_runtime import DevRequest, DevScheduler, check_prompt
from dressage.engines.protocol import (
    SSE_DONE,
    AbortRequest,
    ContinueGenerationRequest,
    GenerateRequest,
    PauseGenerationRequest,
    UpdateWeightsFromDiskRequest,
    sse_event,
)
from dressage.engines.sampling import resolve_sampling
from dressage.engines.tiny_model import LoadedModel
from dressage.errors import DressageError, RequestError


def _error(message: str, status: int = 400) -> JSONResponse:
    """SGLang's error body: ``{"error": {"message": ...}}``."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


def create_app(loaded: LoadedModel, *, seed: int = 0, weight_version: str = "0") -> FastAPI:
    """Build the FastAPI app serving ``loaded``; the scheduler thread stops with the app."""
    scheduler = DevScheduler(loaded, seed=seed, weight_version=weight_version)
    app = FastAPI(title="dressage dev engine", docs_url=None, redoc_url=None)
    app.state.scheduler = scheduler
    app.router.add_event_handler("shutdown", scheduler.stop)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(f"invalid request: {exc.errors()}")

    @app.exception_handler(RequestError)
    async def _bad_request(request: Request, exc: RequestError) -> JSONResponse:
        return _error(str(exc))

    @app.api_route("/generate", methods=["POST", "PUT"], response_model=None)
    async def generate(body: GenerateRequest) -> Response:
        """Generate from token ids (or text, when the model has a tokenizer)."""
        req, queue = _admit(loaded, scheduler, body)
        if not body.stream:
            while True:
                chunk, final = await queue.get()
                if final:
                    return JSONResponse(chunk)
        return StreamingResponse(_stream(scheduler, req.rid, queue), media_type="text/event-stream")

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> Response:
        """End a request (or all) with ``finish_reason.type == "abort"`` and its partial output."""
        scheduler.abort(body.rid, abort_all=body.abort_all)
        return Response(status_code=200)

    @app.post("/pause_generation")
    async def pause_generation(body: PauseGenerationRequest | None = None) -> dict[str, str]:
        """Pause; ``abort`` mode ends in-flight requests, ``in_place``/``retract`` hold them."""
        await asyncio.wrap_future(scheduler.pause((body or PauseGenerationRequest()).mode))
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation(body: ContinueGenerationRequest | None = None) -> dict[str, str]:
        """Resume generation after a pause."""
        await asyncio.wrap_future(scheduler.continue_())
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskRequest) -> JSONResponse:
        """Load safetensors weights from ``model_path`` between tokens; optionally set the version."""
        future = scheduler.update_weights(body.model_path, body.weight_version, body.abort_all_requests)
        try:
            count, held = await asyncio.wrap_future(future)
        except DressageError as e:
            return JSONResponse(
                {"success": False, "message": str(e), "num_paused_requests": 0}, status_code=400
            )
        message = f"Succeeded to update model weights ({count} tensors)."
        if body.weight_version is not None:
            message += f" Weight version updated to {body.weight_version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": held})

    @app.post("/update_weight_version")
    async def update_weight_version(body: dict[str, Any]) -> JSONResponse:
        """Set the reported weight version (``{new_version, abort_all_requests}``)."""
        version = body.get("new_version")
        if not isinstance(version, str):
            return _error("new_version (a string) is required")
        if body.get("abort_all_requests", True):
            scheduler.abort(abort_all=True, message="Abort by update_weight_version")
        await asyncio.wrap_future(scheduler.set_weight_version(version))
        return JSONResponse(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        """SGLang's model info plus vocabulary and routed-experts capture shape."""
        return {
            "model_path": loaded.model_path,
            "tokenizer_path": loaded.model_path if loaded.tokenizer is not None else None,
            "is_generation": True,
            "weight_version": scheduler.weight_version,
            "model_type": loaded.model_type,
            "architectures": getattr(loaded.model.config, "architectures", None),
            "vocab_size": loaded.vocab_size,
            "eos_token_ids": list(loaded.eos_token_ids),
            "max_context": loaded.max_context,
            "num_layers": scheduler.capture.num_layers,
            "num_experts": loaded.num_experts,
            "top_k": loaded.top_k,
            "routed_experts_supported": scheduler.capture.supported,
        }

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        """200 while the scheduler thread runs."""
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        """No prefix cache here: always succeeds."""
        return Response(status_code=200)

    return app


def _admit(
    loaded: LoadedModel, scheduler: DevScheduler, body: GenerateRequest
) -> tuple[DevRequest, asyncio.Queue[Any]]:
    if body.logprob_start_len not in (-1, None):
        raise RequestError(
            "the dev engine returns output logprobs only; leave logprob_start_len at -1",
            param="logprob_start_len",
        )
    if getattr(body, "top_logprobs_num", None):
        raise RequestError("top_logprobs_num is not supported by the dev engine", param="top_logprobs_num")
    if body.input_ids is None:
        if body.text is None:
            raise RequestError("either input_ids or text is required", param="input_ids")
        if loaded.tokenizer is None:
            raise RequestError("this model has no tokenizer; send input_ids", param="text")
        input_ids = list(loaded.tokenizer.encode(body.text, add_special_tokens=False))
    else:
        input_ids = body.input_ids
    check_prompt(loaded, input_ids)
    sampling = resolve_sampling(body.sampling_params)
    if sampling.stop_strs and loaded.tokenizer is None:
        raise RequestError(
            "stop strings need a tokenizer; this model has none, use stop_token_ids", param="stop"
        )
    if body.routed_experts_start_len > len(input_ids):
        raise RequestError(
            "routed_experts_start_len must be in [0, len(input_ids)]", param="routed_experts_start_len"
        )
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(chunk: dict[str, Any], final: bool) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (chunk, final))

    req = DevRequest(
        rid=body.rid or uuid.uuid4().hex,
        input_ids=list(input_ids),
        sampling=sampling,
        return_logprob=body.return_logprob,
        return_routed_experts=body.return_routed_experts,
        routed_experts_start_len=body.routed_experts_start_len,
        stream=body.stream,
        emit=emit,
    )
    scheduler.submit(req)
    return req, queue


async def _stream(scheduler: DevScheduler, rid: str, queue: asyncio.Queue[Any]) -> AsyncIterator[bytes]:
    """SSE chunks until the final one, then ``[DONE]``; a client that goes away aborts the request."""
    finished = False
    try:
        while not finished:
            chunk, finished = await queue.get()
            yield sse_event(chunk)
        yield sse_event(SSE_DONE)
    finally:
        if not finished:
            scheduler.abort(rid, message="client disconnected")
