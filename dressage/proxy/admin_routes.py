"""The admin API (its own bearer token, ``DRESSAGE_ADMIN_TOKEN``), health and metrics.

=========================================  ===============================================================
``POST /admin/runs``                       ``{name, config}`` -> the run (created, or got when it exists)
``POST /admin/sessions``                   ``{run, task_id, attempt, agent, sandbox, info, session_id}``
                                           -> ``{session_id, token, base_url}`` (``session_id``:
                                           optional, chosen by a caller that hashes it to a proxy)
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
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dressage.errors import AuthError, DressageError, RequestError
from dressage.proxy.conversation import parse_json_object
from dressage.proxy.errors import error_body, error_response
from dressage.proxy.service import ProxyService
from dressage.proxy.turns import read_body


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


async def _json(svc: ProxyService, request: Request) -> dict[str, Any]:
    raw = await read_body(request, svc.settings.max_request_bytes)
    if not raw.strip():
        return {}
    return parse_json_object(raw)


INT32 = (-(2**31), 2**31 - 1)
"""The range of the log's integer columns (task ids, attempts, versions)."""


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], required: bool = False) -> Any:
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


def _info(body: dict[str, Any]) -> dict[str, Any] | None:
    """A finalize's ``info``, or its deprecated alias ``metadata`` (both given: refused)."""
    info = _field(body, "info", dict)
    metadata = _field(body, "metadata", dict)
    if info is not None and metadata is not None:
        raise RequestError(
            "give 'info' only ('metadata' is its deprecated alias)", param="metadata", code="invalid_value"
        )
    return info if info is not None else metadata


def admin_routes(svc: ProxyService) -> list[Route]:
    """Admin, health and metrics routes."""

    async def guarded(request: Request, op: Any) -> Response:
        try:
            _check_admin(svc, request)
            body = await _json(svc, request)
            return JSONResponse(await op(body, request))
        except _Forbidden as e:
            return JSONResponse(
                error_body(str(e), "invalid_request_error", None, "admin_disabled"), status_code=403
            )
        except DressageError as e:
            return error_response(e, svc.secrets)

    async def create_run(body: dict[str, Any], request: Request) -> Any:
        run = await svc.create_run(_field(body, "name", str, True), _field(body, "config", dict) or {})
        return {"id": run.id, "name": run.name, "config_hash": run.config_hash, "created_at": run.created_at}

    async def open_session(body: dict[str, Any], request: Request) -> Any:
        handle = await svc.open_session(
            _field(body, "run", str, True),
            task_id=_field(body, "task_id", int),
            attempt=_field(body, "attempt", int) or 1,
            agent=_field(body, "agent", str),
            sandbox=_field(body, "sandbox", str),
            info=_field(body, "info", dict),
            session_id=_field(body, "session_id", str),
        )
        return asdict(handle)

    async def take_over(body: dict[str, Any], request: Request) -> Any:
        handle = await svc.take_over_session(
            request.path_params["session_id"], attempt=_field(body, "attempt", int, True)
        )
        return asdict(handle)

    async def finalize(body: dict[str, Any], request: Request) -> Any:
        reward = _field(body, "reward", (int, float))
        session = await svc.finalize_session(
            request.path_params["session_id"],
            _field(body, "status", str, True),
            reward=float(reward) if reward is not None else None,
            finish_reason=_field(body, "finish_reason", str),
            error=_field(body, "error", str),
            info=_info(body),
            attempt=_field(body, "attempt", int),
        )
        return asdict(session)

    async def pause(body: dict[str, Any], request: Request) -> Any:
        await svc.pause()
        return {"paused": True}

    async def continue_generation(body: dict[str, Any], request: Request) -> Any:
        version = _field(body, "version", int)
        await svc.continue_generation(version)
        return {"paused": False, "version": version}

    def route(path: str, op: Any) -> Route:
        async def endpoint(request: Request) -> Response:
            return await guarded(request, op)

        return Route(path, endpoint, methods=["POST"])

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "paused": svc.coordinator.paused})

    async def metrics(request: Request) -> Response:
        data, content_type = svc.metrics.render()
        return Response(data, media_type=content_type)

    return [
        route("/admin/runs", create_run),
        route("/admin/sessions", open_session),
        route("/admin/sessions/{session_id}/take_over", take_over),
        route("/admin/sessions/{session_id}/resume", take_over),  # deprecated name
        route("/admin/sessions/{session_id}/finalize", finalize),
        route("/admin/pause", pause),
        route("/admin/continue", continue_generation),
        route("/admin/resume", continue_generation),  # deprecated name
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
