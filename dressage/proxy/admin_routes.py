"""The admin API (its own bearer token, ``DRESSAGE_ADMIN_TOKEN``), health and metrics.

=========================================  ===============================================================
``POST /admin/runs``                       ``{name, config}`` -> the run (created, or got when it exists)
``POST /admin/sessions``                   ``{run, task_id, attempt, agent, sandbox, info, session_id,
                                           parent_session_id, fork_turn}`` -> ``{session_id, token,
                                           base_url}`` (``session_id``: optional, chosen by a caller
                                           that hashes it to a proxy; the last two: a fork)
``POST /admin/sessions/{id}/take_over``    ``{attempt}``: a new attempt takes the running session over
                                           -> ``{session_id, token, base_url}`` (``.../resume``: the
                                           same, its former name)
``POST /admin/sessions/{id}/finalize``     ``{status, reward, finish_reason, error, info, attempt}``
                                           (idempotent) -> the session (``metadata``: a deprecated
                                           alias of ``info``)
``POST /admin/pause``                      abort in-flight generations, hold new ones
``POST /admin/continue``                   ``{version}``: continue them; new tokens carry ``version``
                                           (``/admin/resume``: the same, its former name)
``GET /health``                            200 ``{"status": "ok", "paused": bool}`` (no auth)
``GET /metrics``                           Prometheus exposition (no auth)
=========================================  ===============================================================

Without a configured admin token the admin routes answer 403: the Python API
(:class:`~dressage.proxy.server.ProxyServer`) does the same things in-process.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dressage.errors import AuthError, DressageError, RequestError
from dressage.proxy.conversation import parse_json_object
from dressage.proxy.errors import error_body, error_response
from dressage.proxy.service import ProxyService
from dressage.proxy.turns import read_body

JsonObject = dict[str, object]
"""A JSON object as decoded from a request body (its values are checked field by field)."""
Operation = Callable[["ProxyService", JsonObject, Request], Awaitable[JsonObject]]
"""An admin operation: the service, the request's JSON body and the request -> the JSON answer."""


def _check_admin(svc: ProxyService, request: Request) -> None:
    if not svc.admin_token:
        raise _Forbidden(
            "the admin API is disabled: start the proxy with an admin token (DRESSAGE_ADMIN_TOKEN)"
        )
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        value.strip().encode(), svc.admin_token.encode()
    ):
        raise AuthError("the admin API needs 'Authorization: Bearer <admin token>'")


class _Forbidden(DressageError):
    """Admin API disabled."""


async def _json(svc: ProxyService, request: Request) -> JsonObject:
    raw = await read_body(request, svc.settings.max_request_bytes)
    if not raw.strip():
        return {}
    return dict(parse_json_object(raw))


INT32 = (-(2**31), 2**31 - 1)
"""The range of the log's integer columns (task ids, attempts, versions)."""


def _field(body: JsonObject, name: str, kind: type | tuple[type, ...], required: bool = False) -> object:
    """``body[name]`` checked against ``kind`` (None when absent and not ``required``)."""
    value = body.get(name)
    if value is None:
        if required:
            raise RequestError(f"'{name}' is required", param=name, code="missing_field")
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RequestError(f"'{name}' has the wrong type", param=name, code="invalid_type")
    if isinstance(value, int) and not isinstance(value, bool) and not INT32[0] <= value <= INT32[1]:
        raise RequestError(
            f"'{name}' must be a 32-bit integer, got {value}", param=name, code="invalid_value"
        )
    if isinstance(value, str) and required and not value.strip():
        raise RequestError(f"'{name}' must not be empty", param=name, code="invalid_value")
    return value


def _str(body: JsonObject, name: str) -> str | None:
    value = _field(body, name, str)
    return value if isinstance(value, str) else None


def _required_str(body: JsonObject, name: str) -> str:
    value = _field(body, name, str, True)
    assert isinstance(value, str)
    return value


def _int(body: JsonObject, name: str, required: bool = False) -> int | None:
    value = _field(body, name, int, required)
    return value if isinstance(value, int) else None


def _number(body: JsonObject, name: str) -> float | None:
    value = _field(body, name, (int, float))
    return float(value) if isinstance(value, int | float) else None


def _object(body: JsonObject, name: str) -> JsonObject | None:
    value = _field(body, name, dict)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else None


def _info(body: JsonObject) -> JsonObject | None:
    """A finalize's ``info``, or its deprecated alias ``metadata`` (both given: refused)."""
    info = _object(body, "info")
    metadata = _object(body, "metadata")
    if info is not None and metadata is not None:
        raise RequestError(
            "give 'info' only ('metadata' is its deprecated alias)", param="metadata", code="invalid_value"
        )
    return info if info is not None else metadata


# --- the operations ----------------------------------------------------------------------------


async def _create_run(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    run = await svc.create_run(_required_str(body, "name"), _object(body, "config") or {})
    return {"id": run.id, "name": run.name, "config_hash": run.config_hash, "created_at": run.created_at}


async def _open_session(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    handle = await svc.open_session(
        _required_str(body, "run"),
        task_id=_int(body, "task_id"),
        attempt=_int(body, "attempt") or 1,
        agent=_str(body, "agent"),
        sandbox=_str(body, "sandbox"),
        info=_object(body, "info"),
        session_id=_str(body, "session_id"),
        parent_session_id=_str(body, "parent_session_id"),
        fork_turn=_int(body, "fork_turn"),
    )
    return asdict(handle)


async def _take_over(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    attempt = _int(body, "attempt", True)
    assert attempt is not None
    handle = await svc.take_over_session(
        request.path_params["session_id"], attempt=attempt, info=_object(body, "info")
    )
    return asdict(handle)


async def _finalize(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    reward = _number(body, "reward")
    session = await svc.finalize_session(
        request.path_params["session_id"],
        _required_str(body, "status"),
        reward=reward,
        finish_reason=_str(body, "finish_reason"),
        error=_str(body, "error"),
        info=_info(body),
        attempt=_int(body, "attempt"),
    )
    return asdict(session)


async def _pause(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    await svc.pause()
    return {"paused": True}


async def _continue_generation(svc: ProxyService, body: JsonObject, request: Request) -> JsonObject:
    version = _int(body, "version")
    await svc.continue_generation(version)
    return {"paused": False, "version": version}


def _route(svc: ProxyService, path: str, op: Operation) -> Route:
    """A POST admin route: checks the admin token, decodes the body, answers errors as JSON."""

    async def endpoint(request: Request) -> Response:
        try:
            _check_admin(svc, request)
            body = await _json(svc, request)
            return JSONResponse(await op(svc, body, request))
        except _Forbidden as e:
            return JSONResponse(
                error_body(str(e), "invalid_request_error", None, "admin_disabled"), status_code=403
            )
        except DressageError as e:
            return error_response(e, svc.secrets)

    return Route(path, endpoint, methods=["POST"])


def admin_routes(svc: ProxyService) -> list[Route]:
    """Admin, health and metrics routes."""

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "paused": svc.coordinator.paused})

    async def metrics(request: Request) -> Response:
        data, content_type = svc.metrics.render()
        return Response(data, media_type=content_type)

    return [
        _route(svc, "/admin/runs", _create_run),
        _route(svc, "/admin/sessions", _open_session),
        _route(svc, "/admin/sessions/{session_id}/take_over", _take_over),
        _route(svc, "/admin/sessions/{session_id}/resume", _take_over),  # deprecated name
        _route(svc, "/admin/sessions/{session_id}/finalize", _finalize),
        _route(svc, "/admin/pause", _pause),
        _route(svc, "/admin/continue", _continue_generation),
        _route(svc, "/admin/resume", _continue_generation),  # deprecated name
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
