"""``dressage-worker view bundle``: a static copy of a run that opens from disk with no server.

The same templates and data as the live viewer, rendered once with relative links
(:class:`~dressage.view.urls.BundleUrls`): ``index.html`` (the run with every chosen session in
one table), one page per session, group, training step and SQL text, the artifacts of the chosen
sessions, and the viewer's static files. What needs a server is left out and the pages say so:
filters and sorting, live updates, routed experts on hover.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from dressage.errors import ConfigError, UnknownSessionError
from dressage.view import pages, queries
from dressage.view.pages import Viewer
from dressage.view.rendering import STATIC, environment, render
from dressage.view.urls import BundleUrls, file_name


def write_bundle(
    viewer: Viewer,
    run_name: str,
    out: Path,
    *,
    session_ids: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write the static copy of ``run_name`` (or only ``session_ids`` of it) to ``out``; returns the
    number of pages written. ``out`` must be absent or empty."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; choose a new directory for the bundle")
    store = viewer.store
    run = store.runs.get(run_name)
    ctx = pages.run_page(viewer, run.name, {}, all_sessions=True)
    if session_ids is not None:
        wanted = set(session_ids)
        known = {r["session"] for r in ctx["table"].rows}
        missing = sorted(wanted - known)
        if missing:
            raise UnknownSessionError(f"run {run.name!r} has no session {missing[0]!r}")
        ctx["table"].rows = [r for r in ctx["table"].rows if r["session"] in wanted]
        ctx["table"].total = len(ctx["table"].rows)
    sessions = [r["session"] for r in ctx["table"].rows]
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(STATIC, out / "static")
    env = environment()
    artifact_names = _copy_artifacts(viewer, run.name, sessions, out / "artifacts")
    written = 0

    def page(path: str, template: str, context: dict[str, object]) -> None:
        nonlocal written
        depth = path.count("/")
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        urls = BundleUrls(run.name, depth, artifact_names)
        target.write_text(render(env, template, {"u": urls, **context}), encoding="utf-8")
        written += 1

    ctx["live_query"] = ""
    page("index.html", "run.html", ctx)
    groups = sorted({int(r["group"]) for r in ctx["table"].rows if r.get("group") is not None})
    total = len(sessions) + len(groups)
    for i, sid in enumerate(sessions):
        page(f"sessions/{file_name(sid)}.html", "session.html", pages.session_page(viewer, sid))
        page(f"sql/{file_name(sid)}.html", "sql.html", pages.sql_page(viewer, sid))
        if progress:
            progress(i + 1, total)
    for j, g in enumerate(groups):
        page(f"groups/{g}.html", "group.html", pages.group_page(viewer, run.name, g))
        if progress:
            progress(len(sessions) + j + 1, total)
    page("training.html", "training.html", pages.training_page(viewer, run.name))
    for consumer in queries.consumers(store, run):
        for s in queries.steps(store, run, consumer):
            page(
                f"steps/{file_name(consumer)}-{s.step}.html",
                "step.html",
                pages.step_page(viewer, run.name, consumer, s.step),
            )
    return written


def _copy_artifacts(viewer: Viewer, run: str, sessions: list[str], folder: Path) -> dict[int, str]:
    """Copy the sessions' artifacts as ``<id>-<safe name>``; returns the file name by artifact id."""
    wanted = set(sessions)
    names: dict[int, str] = {}
    for ref in viewer.store.artifacts.list(run):
        if ref.session_id not in wanted:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in ref.name)[:80] or "artifact"
        name = f"{ref.id}-{safe}"
        (folder / name).write_bytes(viewer.store.artifacts.get(ref))
        names[ref.id] = name
    return names
