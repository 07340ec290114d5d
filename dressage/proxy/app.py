"""The app factory: a Starlette app wiring the OpenAI and admin routes of one :class:`ProxyService`.

Starlette rather than FastAPI: bodies are validated by hand (see :mod:`dressage.proxy.conversation`)
so every error has OpenAI's shape, and the hot path skips dependency injection. Unknown routes,
wrong methods and unexpected exceptions also answer in OpenAI's error format.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from dressage.proxy.admin_routes import admin_routes
from dressage.proxy.errors import error_response, http_error
from dressage.proxy.routes import model_routes
from dressage.proxy.service import ProxyService


def create_app(svc: ProxyService) -> Starlette:
    """The ASGI app of ``svc``."""

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return http_error(exc.status_code, str(exc.detail))

    async def on_error(request: Request, exc: Exception) -> Response:
        svc.metrics.errors.labels("500", "internal_error").inc()
        return error_response(exc, svc.secrets)

    app = Starlette(
        routes=[*model_routes(svc), *admin_routes(svc)],
        exception_handlers={HTTPException: on_http_error, Exception: on_error},
    )
    app.state.service = svc
    return app
