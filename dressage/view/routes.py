"""The viewer's pages and APIs (every handler reads; none writes).

Names and ids travel in query strings (see :mod:`dressage.view.urls`). Errors: an unknown run or
session is a 404 page, a bad query value a 400 page naming the field; each says what to do. The
store is synchronous, so handlers run its reads in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dressage.errors import DressageError, RequestError, UnknownRunError, UnknownSessionError
from dressage.paddock.workspace_diffs import is_text
from dressage.view import pages, queries
from dressage.view.live import LiveStreams, event_stream
from dressage.view.pages import Viewer
from dressage.view.rendering import render
from dressage.view.tokens import experts_at
from dressage.view.urls import ServerUrls

URLS = ServerUrls()
Handler = Callable[[Request], Awaitable[Response]]


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise RequestError(f"missing query parameter {name!r}", param=name)
    return value


def _int(request: Request, name: str) -> int:
    text = _param(request, name)
    try:
        return int(text)
    except ValueError:
        raise RequestError(f"{name} must be an integer, got {text!r}", param=name) from None


class _Pages:
    """The viewer's request handlers: each page, the artifact and experts endpoints, the live stream."""

    def __init__(self, viewer: Viewer, env: Environment, streams: LiveStreams) -> None:
        self.viewer, self.env, self.streams = viewer, env, streams

    def html(self, name: str, context: dict[str, object], status: int = 200) -> HTMLResponse:
        return HTMLResponse(render(self.env, name, {"u": URLS, **context}), status_code=status)

    def guarded(self, fn: Callable[[Request], Response]) -> Handler:
        """Run ``fn`` in a thread; turn our errors into a 4xx page."""

        async def handler(request: Request) -> Response:
            try:
                return await asyncio.to_thread(fn, request)
            except (UnknownRunError, UnknownSessionError) as e:
                return self.html("error.html", {"status": "Not found", "message": str(e)}, 404)
            except RequestError as e:
                return self.html("error.html", {"status": "Bad request", "message": str(e)}, 400)
            except DressageError as e:
                return self.html(
                    "error.html", {"status": "The log could not be read", "message": str(e)}, 503
                )

        return handler

    def runs(self, request: Request) -> Response:
        return self.html("runs.html", pages.runs_page(self.viewer))

    def run(self, request: Request) -> Response:
        name = _param(request, "name")
        params = {k: v for k, v in request.query_params.items() if k not in ("name", "fragment")}
        ctx = pages.run_page(self.viewer, name, params)
        ctx["live_query"] = urlencode({"run": name, "after": ctx["overview"].summary.last_position})
        if request.query_params.get("fragment") == "summary":
            return self.html("_run_summary.html", ctx)
        return self.html("run.html", ctx)

    def session(self, request: Request) -> Response:
        ctx = pages.session_page(self.viewer, _param(request, "id"))
        if request.query_params.get("fragment") == "body":
            return self.html("_session_body.html", ctx)
        return self.html("session.html", ctx)

    def tree(self, request: Request) -> Response:
        return self.html("tree.html", pages.tree_page(self.viewer, _param(request, "session")))

    def sql(self, request: Request) -> Response:
        return self.html("sql.html", pages.sql_page(self.viewer, _param(request, "session")))

    def group(self, request: Request) -> Response:
        a, b = request.query_params.get("a"), request.query_params.get("b")
        diff = (a, b) if a and b else None
        return self.html(
            "group.html", pages.group_page(self.viewer, _param(request, "run"), _int(request, "group"), diff)
        )

    def training(self, request: Request) -> Response:
        return self.html("training.html", pages.training_page(self.viewer, _param(request, "run")))

    def compare(self, request: Request) -> Response:
        chosen = [x for value in request.query_params.getlist("runs") for x in value.split(",")]
        return self.html("compare.html", pages.compare_page(self.viewer, chosen))

    def step(self, request: Request) -> Response:
        ctx = pages.step_page(
            self.viewer, _param(request, "run"), _param(request, "consumer"), _int(request, "step")
        )
        return self.html("step.html", ctx)

    def artifact(self, request: Request) -> Response:
        artifact_id = _int(request, "id")
        ref = queries.artifact_by_id(self.viewer.store, artifact_id)
        if ref is None:
            raise RequestError(f"no artifact with id {artifact_id}", param="id")
        data = self.viewer.store.artifacts.get(ref)
        safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in ref.name) or "artifact"
        if request.query_params.get("download") or not is_text(data):
            return Response(
                data,
                media_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{safe_name}"'},
            )
        text = self.viewer.redact(data.decode("utf-8")) or ""
        return Response(
            text, media_type="text/plain; charset=utf-8", headers={"Content-Security-Policy": "sandbox"}
        )

    def experts(self, request: Request) -> Response:
        sid = _param(request, "session")
        self.viewer.store.sessions.get(sid)
        turns = self.viewer.store.turns.read(session_id=sid, with_experts=True)
        rows = experts_at(turns, _int(request, "segment"), _int(request, "position"))
        return JSONResponse({"experts": rows})

    async def live(self, request: Request) -> Response:
        sid = request.query_params.get("session")
        try:
            if sid:
                s = await asyncio.to_thread(self.viewer.store.sessions.get, sid)
                run_name = (await asyncio.to_thread(self.viewer.store.runs.by_id, s.run_id)).name
            else:
                run_name = _param(request, "run")
                await asyncio.to_thread(self.viewer.store.runs.get, run_name)
            resume = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
            after = int(resume)
        except ValueError:
            return JSONResponse({"error": "after must be an integer position"}, status_code=400)
        except (UnknownRunError, UnknownSessionError, RequestError) as e:
            return JSONResponse(
                {"error": str(e)}, status_code=404 if not isinstance(e, RequestError) else 400
            )
        except DressageError as e:
            return JSONResponse({"error": str(e)}, status_code=503)
        store, streams, disconnected = self.viewer.store, self.streams, request.is_disconnected
        stream = event_stream(
            store, run_name, after, session_id=sid, disconnected=disconnected, streams=streams
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def page_routes(viewer: Viewer, env: Environment, streams: LiveStreams) -> list[Route]:
    """Every route of the viewer (``streams``: the stop flag of its live event streams)."""
    h = _Pages(viewer, env, streams)
    return [
        Route("/", h.guarded(h.runs)),
        Route("/run", h.guarded(h.run)),
        Route("/session", h.guarded(h.session)),
        Route("/tree", h.guarded(h.tree)),
        Route("/sql", h.guarded(h.sql)),
        Route("/group", h.guarded(h.group)),
        Route("/training", h.guarded(h.training)),
        Route("/compare", h.guarded(h.compare)),
        Route("/step", h.guarded(h.step)),
        Route("/artifact", h.guarded(h.artifact)),
        Route("/api/experts", h.guarded(h.experts)),
        Route("/live", h.live),
    ]
