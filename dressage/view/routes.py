"""The viewer's pages and APIs (every handler reads; none writes).

Names and ids travel in query strings (see :mod:`dressage.view.urls`). Errors: an unknown run or
session is a 404 page, a bad query value a 400 page naming the field; each says what to do. The
store is synchronous, so handlers run its reads in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dressage.errors import DressageError, RequestError, UnknownRunError, UnknownSessionError
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


def page_routes(viewer: Viewer, env: Environment, streams: LiveStreams) -> list[Route]:
    """Every route of the viewer (``streams``: the stop flag of its live event streams)."""

    def html(name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        return HTMLResponse(render(env, name, {"u": URLS, **context}), status_code=status)

    def guarded(fn: Callable[[Request], Response]) -> Handler:
        """Run ``fn`` in a thread; turn our errors into a 4xx page."""

        async def handler(request: Request) -> Response:
            try:
                return await asyncio.to_thread(fn, request)
            except (UnknownRunError, UnknownSessionError) as e:
                return html("error.html", {"status": "Not found", "message": str(e)}, 404)
            except RequestError as e:
                return html("error.html", {"status": "Bad request", "message": str(e)}, 400)
            except DressageError as e:
                return html("error.html", {"status": "The log could not be read", "message": str(e)}, 503)

        return handler

    def runs(request: Request) -> Response:
        return html("runs.html", pages.runs_page(viewer))

    def run(request: Request) -> Response:
        name = _param(request, "name")
        params = {k: v for k, v in request.query_params.items() if k not in ("name", "fragment")}
        ctx = pages.run_page(viewer, name, params)
        ctx["live_query"] = urlencode({"run": name, "after": ctx["overview"].last_position})
        if request.query_params.get("fragment") == "summary":
            return html("_run_summary.html", ctx)
        return html("run.html", ctx)

    def session(request: Request) -> Response:
        ctx = pages.session_page(viewer, _param(request, "id"))
        if request.query_params.get("fragment") == "body":
            return html("_session_body.html", ctx)
        return html("session.html", ctx)

    def sql(request: Request) -> Response:
        return html("sql.html", pages.sql_page(viewer, _param(request, "session")))

    def group(request: Request) -> Response:
        a, b = request.query_params.get("a"), request.query_params.get("b")
        diff = (a, b) if a and b else None
        return html(
            "group.html", pages.group_page(viewer, _param(request, "run"), _int(request, "group"), diff)
        )

    def training(request: Request) -> Response:
        return html("training.html", pages.training_page(viewer, _param(request, "run")))

    def compare(request: Request) -> Response:
        chosen = [x for value in request.query_params.getlist("runs") for x in value.split(",")]
        return html("compare.html", pages.compare_page(viewer, chosen))

    def step(request: Request) -> Response:
        ctx = pages.step_page(
            viewer, _param(request, "run"), _param(request, "consumer"), _int(request, "step")
        )
        return html("step.html", ctx)

    def artifact(request: Request) -> Response:
        artifact_id = _int(request, "id")
        ref = queries.artifact_by_id(viewer.store, artifact_id)
        if ref is None:
            raise RequestError(f"no artifact with id {artifact_id}", param="id")
        data = viewer.store.artifacts.get(ref)
        safe_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in ref.name) or "artifact"
        if request.query_params.get("download") or not _is_text(data):
            return Response(
                data,
                media_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{safe_name}"'},
            )
        text = viewer.redact(data.decode("utf-8")) or ""
        return Response(
            text, media_type="text/plain; charset=utf-8", headers={"Content-Security-Policy": "sandbox"}
        )

    def experts(request: Request) -> Response:
        sid = _param(request, "session")
        viewer.store.sessions.get(sid)
        turns = viewer.store.turns.read(session_id=sid, with_experts=True)
        rows = experts_at(turns, _int(request, "segment"), _int(request, "position"))
        return JSONResponse({"experts": rows})

    async def live(request: Request) -> Response:
        sid = request.query_params.get("session")
        try:
            if sid:
                s = await asyncio.to_thread(viewer.store.sessions.get, sid)
                run_name = (await asyncio.to_thread(viewer.store.runs.by_id, s.run_id)).name
            else:
                run_name = _param(request, "run")
                await asyncio.to_thread(viewer.store.runs.get, run_name)
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
        stream = event_stream(
            viewer.store,
            run_name,
            after,
            session_id=sid,
            disconnected=request.is_disconnected,
            streams=streams,
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    return [
        Route("/", guarded(runs)),
        Route("/run", guarded(run)),
        Route("/session", guarded(session)),
        Route("/sql", guarded(sql)),
        Route("/group", guarded(group)),
        Route("/training", guarded(training)),
        Route("/compare", guarded(compare)),
        Route("/step", guarded(step)),
        Route("/artifact", guarded(artifact)),
        Route("/api/experts", guarded(experts)),
        Route("/live", live),
    ]


def _is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
