"""The model-facing routes of every dialect, under ``/v1`` and ``/s/{token}/v1`` (Gemini also ``/v1beta``).

==============================================  ========================================================
route                                           dialect
==============================================  ========================================================
``POST /v1/chat/completions``                   OpenAI chat completions (:mod:`.dialects.chat`)
``POST /v1/messages``                           Anthropic Messages (:mod:`.dialects.messages`)
``POST /v1/messages/count_tokens``              Anthropic token counting (exact, our tokenizer)
``POST /v1/responses``                          OpenAI Responses (:mod:`.dialects.responses`)
``GET /v1/models``, ``/v1/models/{id}``         the one model this proxy serves
``POST /v1beta/models/{m}:generateContent``     Gemini API (:mod:`.dialects.gemini`; also under ``/v1``)
``POST .../models/{m}:streamGenerateContent``   Gemini API streamed (``?alt=sse`` only)
``POST .../models/{m}:countTokens``             Gemini token counting (exact, our tokenizer)
``GET /v1beta/models``, ``/v1beta/models/{m}``  the served model as a Gemini ``Model``
==============================================  ========================================================

Each generate route is the same :class:`~dressage.proxy.turns.TurnHandler` with another dialect;
the URL form ``/s/<token>/v1/...`` lets an unmodified client work by setting its base URL alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dressage.errors import DressageError, RequestError
from dressage.proxy.conversation import Conversation
from dressage.proxy.dialects.base import Dialect
from dressage.proxy.dialects.chat import ChatDialect
from dressage.proxy.dialects.gemini import GeminiDialect
from dressage.proxy.dialects.gemini import parse_count_tokens_request as parse_gemini_count
from dressage.proxy.dialects.gemini_models import ModelInfo, ModelList
from dressage.proxy.dialects.messages import MessagesDialect, parse_count_tokens_request
from dressage.proxy.dialects.responses import ResponsesDialect
from dressage.proxy.service import ProxyService
from dressage.proxy.turns import TurnHandler, read_body

Endpoint = Callable[[Request], Awaitable[Response]]


def _generate(handler: TurnHandler, dialect: Dialect) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return await handler.handle(request, dialect)

    return endpoint


async def _model_entry(svc: ProxyService) -> dict[str, object]:
    """The served model as OpenAI lists it, with vLLM's ``root`` / ``parent`` / ``max_model_len`` (the context window)."""
    return {
        "id": svc.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "dressage",
        "root": svc.model_name,
        "parent": None,
        "max_model_len": await svc.context_window(),
    }


def _models(handler: TurnHandler, dialect: Dialect) -> tuple[Endpoint, Endpoint]:
    svc = handler.svc

    async def models(request: Request) -> Response:
        try:
            await handler.authenticate(request, dialect)
        except DressageError as e:
            return dialect.error_response(e, svc.secrets)
        return JSONResponse({"object": "list", "data": [await _model_entry(svc)]})

    async def model(request: Request) -> Response:
        try:
            await handler.authenticate(request, dialect)
            if request.path_params["model_id"] != svc.model_name:
                raise RequestError(
                    f"model {request.path_params['model_id']!r} is not served here (only {svc.model_name!r})",
                    param="model",
                    code="model_not_found",
                )
        except DressageError as e:
            return dialect.error_response(e, svc.secrets)
        return JSONResponse(await _model_entry(svc))

    return models, model


def _count_tokens(
    handler: TurnHandler, dialect: Dialect, parse: Callable[[bytes], Conversation], key: str
) -> Endpoint:
    """A dialect's token-count route (Messages ``count_tokens``, Gemini ``:countTokens``): the exact
    prompt length the conversation ``parse`` reads would have, as ``{key: n}``."""
    svc = handler.svc

    async def count_tokens(request: Request) -> Response:
        try:
            state = await handler.authenticate(request, dialect)
            conv = parse(await read_body(request, svc.settings.max_request_bytes))
            plan = state.index.plan(conv.messages, conv.tools, conv.enable_thinking)
        except DressageError as e:
            return dialect.error_response(e, svc.secrets)
        return JSONResponse({key: plan.prompt_len})

    return count_tokens


def _gemini_stream(handler: TurnHandler, dialect: GeminiDialect) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        """``:streamGenerateContent``: server-sent events only (``?alt=sse``, what the SDK asks for)."""
        if request.query_params.get("alt") != "sse":
            err = RequestError(
                "streamGenerateContent is served as server-sent events only: add ?alt=sse", param="alt"
            )
            return dialect.error_response(err, handler.svc.secrets)
        return await handler.handle(request, dialect)

    return endpoint


def _gemini_models(handler: TurnHandler, dialect: GeminiDialect) -> tuple[Endpoint, Endpoint]:
    """``GET models`` and ``GET models/{model}`` in the Gemini API's ``Model`` shape."""
    svc = handler.svc

    async def info() -> ModelInfo:
        window = await svc.context_window()
        name = svc.model_name
        return ModelInfo(
            name=f"models/{name}", base_model_id=name, display_name=name,
            input_token_limit=window, output_token_limit=window,
        )  # fmt: skip

    async def models(request: Request) -> Response:
        try:
            await handler.authenticate(request, dialect)
        except DressageError as e:
            return dialect.error_response(e, svc.secrets)
        return JSONResponse(ModelList(models=[await info()]).wire())

    async def model(request: Request) -> Response:
        try:
            await handler.authenticate(request, dialect)
            if request.path_params["model"] != svc.model_name:
                raise RequestError(
                    f"model {request.path_params['model']!r} is not served here (only {svc.model_name!r})",
                    param="model",
                    code="model_not_found",
                )
        except DressageError as e:
            return dialect.error_response(e, svc.secrets)
        return JSONResponse((await info()).wire())

    return models, model


def gemini_routes(handler: TurnHandler, prefix: str) -> list[Route]:
    """The Gemini API's routes under ``prefix`` (``/v1beta``, ``/v1``, and both below ``/s/{token}``)."""
    svc = handler.svc
    plain = GeminiDialect(svc.profile, svc.model_name)
    streamed = GeminiDialect(svc.profile, svc.model_name, stream=True)
    base = f"{prefix}/models/{{model}}"
    routes = [
        Route(f"{base}:generateContent", _generate(handler, plain), methods=["POST"]),
        Route(f"{base}:streamGenerateContent", _gemini_stream(handler, streamed), methods=["POST"]),
        Route(
            f"{base}:countTokens",
            _count_tokens(handler, plain, parse_gemini_count, "totalTokens"),
            methods=["POST"],
        ),
    ]
    if prefix.endswith("/v1beta"):  # under /v1 the OpenAI model routes answer GET
        models, model = _gemini_models(handler, plain)
        routes += [Route(f"{prefix}/models", models, methods=["GET"]), Route(base, model, methods=["GET"])]
    return routes


def model_routes(svc: ProxyService) -> list[Route]:
    """Every dialect's routes, under ``/v1`` and ``/s/{token}/v1``."""
    handler = TurnHandler(svc)
    chat = ChatDialect(svc.profile, svc.model_name)
    messages = MessagesDialect(svc.profile, svc.model_name)
    responses = ResponsesDialect(svc.profile, svc.model_name)
    models, model = _models(handler, chat)
    routes = []
    for prefix in ("/v1", "/s/{token}/v1"):
        routes.append(Route(f"{prefix}/chat/completions", _generate(handler, chat), methods=["POST"]))
        routes.append(Route(f"{prefix}/messages", _generate(handler, messages), methods=["POST"]))
        routes.append(
            Route(
                f"{prefix}/messages/count_tokens",
                _count_tokens(handler, messages, parse_count_tokens_request, "input_tokens"),
                methods=["POST"],
            )
        )
        routes.append(Route(f"{prefix}/responses", _generate(handler, responses), methods=["POST"]))
        routes += gemini_routes(handler, prefix)
        routes += gemini_routes(handler, prefix.removesuffix("/v1") + "/v1beta")
        routes.append(Route(f"{prefix}/models", models, methods=["GET"]))
        routes.append(Route(f"{prefix}/models/{{model_id:path}}", model, methods=["GET"]))
    return routes
