"""The viewer's app factory: a Starlette app over a read-only :class:`EventStore`.

Starlette (FastAPI's core, as the proxy uses) with Jinja2 templates; routes live in
:mod:`dressage.view.routes`. Safety is wired here:

* **token**: when the viewer listens beyond loopback it requires a token, given once as
  ``?token=...`` (then kept in an HttpOnly, SameSite=Strict cookie) or as ``Authorization: Bearer``;
* **headers**: a Content-Security-Policy that allows scripts only from the viewer's own files (no
  inline script, no ``eval``), ``nosniff``, no referrer, no framing; so even text that escaped
  escaping could not run;
* **read-only**: the store's connections refuse writes (:mod:`dressage.view.readonly`).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from dressage.store import EventStore
from dressage.view.decode import TokenDecoder, default_decoder
from dressage.view.live import LiveStreams
from dressage.view.pages import Viewer
from dressage.view.rendering import STATIC, environment
from dressage.view.routes import page_routes

TOKEN_COOKIE = "dressage_view_token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]


class SecurityMiddleware(BaseHTTPMiddleware):
    """Adds the security headers; with a token set, refuses requests that do not carry it."""

    def __init__(self, app: object, token: str | None) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.token = token

    async def dispatch(self, request: Request, call_next: Handler) -> Response:
        if self.token is not None:
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given, self.token):
                rest = [(k, v) for k, v in parse_qsl(request.url.query) if k != "token"]
                target = request.url.path + ("?" + urlencode(rest) if rest else "")
                response: Response = RedirectResponse(target, status_code=303)
                response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
                return _secured(response)
            if not self._authorized(request):
                return _secured(
                    PlainTextResponse(
                        "this viewer needs its token: open the URL `dressage-worker view` printed "
                        "(…?token=...) or send Authorization: Bearer <token>",
                        status_code=401,
                    )
                )
        response = await call_next(request)
        if request.url.path.startswith("/static/") and request.query_params.get("v"):
            # versioned by content (ServerUrls.static): never changes under this URL
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return _secured(response)

    def _authorized(self, request: Request) -> bool:
        assert self.token is not None
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else ""
        return any(hmac.compare_digest(x, self.token) for x in (cookie, bearer) if x)


def _secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def create_app(
    store: EventStore, *, token: str | None = None, decoder: TokenDecoder | None = None
) -> Starlette:
    """The viewer app over ``store`` (opened read-only); ``token`` required on every request when set.

    ``app.state.live`` stops its live event streams: serve it with
    :class:`dressage.view.server.ViewServer`, which does so at shutdown.
    """
    viewer = Viewer(store, decoder or default_decoder())
    env = environment()
    streams = LiveStreams()
    app = Starlette(
        routes=[
            *page_routes(viewer, env, streams),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(SecurityMiddleware, token=token)],
    )
    app.state.viewer = viewer
    app.state.live = streams
    return app
