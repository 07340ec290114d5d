"""The CPU dev engine: SGLang's native HTTP protocol served from a transformers model.

It lets the proxy, rollout workers and tests run on a laptop against the same wire protocol as a
GPU SGLang server (see :mod:`dressage.engines.protocol` for the facts pinned). Routes:
``/generate`` (JSON or SSE), ``/abort_request``, ``/pause_generation``, ``/continue_generation``,
``/update_weights_from_disk``, ``/update_weight_version``, ``/model_info``, ``/health``.

Sampling follows SGLang (:mod:`dressage.engines.sampling`): temperature, top-p/k, min-p, the
frequency / presence / repetition penalties, ``top_logprobs_num``, and constrained decoding with
``json_schema`` / ``regex`` / ``ebnf`` by xgrammar token masks (:mod:`dressage.engines.grammar`),
deferred past ``</think>`` with ``require_reasoning``.

Differences from SGLang, on purpose: requests without ``sampling_seed`` are still deterministic
(seeded from the engine seed and the rid); routed experts are always capturable (no server flag);
input-token logprobs (``logprob_start_len >= 0``), batched requests, parallel sampling (``n > 1``:
send n requests), ``top_logprobs_num`` without ``return_logprob``, and the sampling params it does
not implement (``structural_tag``, ``logit_bias``, ``min_new_tokens``, ``stop_regex``,
``custom_params``) are refused with 400 instead of being ignored.
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
from dressage.engines.grammar import CompiledConstraint, GrammarBackend, GrammarSpec
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


def create_app(
    loaded: LoadedModel,
    *,
    seed: int = 0,
    weight_version: str = "0",
    constrained_json_disable_any_whitespace: bool = False,
) -> FastAPI:
    """Build the FastAPI app serving ``loaded``; the scheduler thread stops with the app.

    ``constrained_json_disable_any_whitespace`` is SGLang's server flag of that name: JSON-schema
    output without free whitespace between tokens (a random model otherwise fills it with spaces).
    """
    scheduler = DevScheduler(loaded, seed=seed, weight_version=weight_version)
    grammars = GrammarBackend(
        loaded.tokenizer,
        loaded.vocab_size,
        loaded.eos_token_ids,
        json_any_whitespace=not constrained_json_disable_any_whitespace,
    )
    app = FastAPI(title="dressage dev engine", docs_url=None, redoc_url=None)
    app.state.scheduler = scheduler
    app.router.add_event_handler("shutdown", scheduler.stop)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(f"invalid request: {exc.errors()}")

    @app.exception_handler(RequestError)
    async def _bad_request(request: Request, exc: RequestError) -> JSONResponse:
        return _error(str(exc))

    _generation_routes(app, loaded, scheduler, grammars)
    _control_routes(app, scheduler)
    _info_routes(app, loaded, scheduler)
    return app


def _generation_routes(
    app: FastAPI, loaded: LoadedModel, scheduler: DevScheduler, grammars: GrammarBackend
) -> None:
    """``/generate`` (SGLang's native API, by ids) and ``/abort_request``."""

    @app.api_route("/generate", methods=["POST", "PUT"], response_model=None)
    async def generate(body: GenerateRequest) -> Response:
        """Generate from token ids (or text, when the model has a tokenizer)."""
        _check_supported(body)
        constraint = await _constraint(grammars, body)
        req, queue = _admit(loaded, scheduler, body, constraint)
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


def _control_routes(app: FastAPI, scheduler: DevScheduler) -> None:
    """Pause / continue generation and weight updates (what a trainer's weight push calls)."""

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


def _info_routes(app: FastAPI, loaded: LoadedModel, scheduler: DevScheduler) -> None:
    """Model info, health and the (no-op) cache flush."""

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


_UNIMPLEMENTED_SAMPLING: dict[str, tuple[Any, str]] = {
    "n": (1, "parallel sampling (n > 1) is not implemented by the dev engine; send n requests"),
    "structural_tag": (
        None,
        "structural_tag is not implemented by the dev engine; use json_schema, regex or ebnf",
    ),
    "logit_bias": (None, "logit_bias is not implemented by the dev engine"),
    "min_new_tokens": (0, "min_new_tokens is not implemented by the dev engine"),
    "stop_regex": (None, "stop_regex is not implemented by the dev engine; use stop strings"),
    "custom_params": (None, "custom logit processors are not implemented by the dev engine"),
}
"""Sampling params SGLang has and the dev engine does not: (neutral value, why refused otherwise)."""


async def _constraint(grammars: GrammarBackend, body: GenerateRequest) -> CompiledConstraint | None:
    """The request's compiled grammar (compiled off the event loop), or None."""
    spec = GrammarSpec.from_sampling(body.sampling_params)
    if spec is None:
        return None
    return await asyncio.to_thread(grammars.compile, spec, require_reasoning=bool(body.require_reasoning))


def _check_supported(body: GenerateRequest) -> None:
    if body.logprob_start_len not in (-1, None):
        raise RequestError(
            "the dev engine returns output logprobs only; leave logprob_start_len at -1",
            param="logprob_start_len",
        )
    if body.top_logprobs_num and not body.return_logprob:
        raise RequestError("top_logprobs_num needs return_logprob", param="top_logprobs_num")
    extra = body.sampling_params.model_extra or {}
    for name, (neutral, why) in _UNIMPLEMENTED_SAMPLING.items():
        if extra.get(name) not in (None, neutral):
            raise RequestError(why, param=f"sampling_params.{name}")


def _admit(
    loaded: LoadedModel, scheduler: DevScheduler, body: GenerateRequest, constraint: CompiledConstraint | None
) -> tuple[DevRequest, asyncio.Queue[Any]]:
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
        top_logprobs_num=body.top_logprobs_num or 0,
        grammar=constraint.start() if constraint is not None else None,
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
