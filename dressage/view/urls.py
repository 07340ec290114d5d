"""Links between the viewer's pages, for the server (query-string URLs) and for a static bundle.

Run names and session ids are arbitrary text (a session id may hold ``/`` or ``..``), so the server
passes them in query strings, never in paths, and the bundle names files after a hash of them.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from urllib.parse import urlencode

from dressage.view.rendering import STATIC


@cache
def static_version(path: str) -> str:
    """A short hash of a static file's content: its URL changes when the file does, so browsers
    may cache it for good (the server sends it as immutable)."""
    return hashlib.sha256((STATIC / path).read_bytes()).hexdigest()[:12]


class ServerUrls:
    """URLs of the running viewer."""

    live = True

    def static(self, path: str) -> str:
        """A file under the viewer's ``static/`` directory, versioned by its content."""
        return f"/static/{path}?v={static_version(path)}"

    def runs(self) -> str:
        """The runs page."""
        return "/"

    def run(self, run: str, **params: object) -> str:
        """A run's page (with the sessions table's query string)."""
        return "/run?" + urlencode({"name": run, **{k: v for k, v in params.items() if v is not None}})

    def session(self, session_id: str) -> str:
        """A session's page."""
        return "/session?" + urlencode({"id": session_id})

    def tree(self, session_id: str) -> str:
        """The fork tree a session belongs to."""
        return "/tree?" + urlencode({"session": session_id})

    def sql(self, session_id: str) -> str:
        """The SQL behind a session's page."""
        return "/sql?" + urlencode({"session": session_id})

    def group(self, run: str, group: int, diff: tuple[str, str] | None = None) -> str:
        """A group's page (optionally with a diff of two of its sessions)."""
        params: dict[str, object] = {"run": run, "group": group}
        if diff:
            params["a"], params["b"] = diff
        return "/group?" + urlencode(params)

    def training(self, run: str) -> str:
        """A run's consumers and steps."""
        return "/training?" + urlencode({"run": run})

    def compare(self, runs: list[str]) -> str:
        """Runs' reward curves overlaid."""
        return "/compare?" + urlencode({"runs": ",".join(runs)})

    def step(self, run: str, consumer: str, step: int) -> str:
        """One step's manifest."""
        return "/step?" + urlencode({"run": run, "consumer": consumer, "step": step})

    def artifact(self, artifact_id: int, *, download: bool = False) -> str:
        """An artifact, opened as text or downloaded."""
        return f"/artifact?id={artifact_id}" + ("&download=1" if download else "")


def file_name(text: str) -> str:
    """A safe, unique file name stem for a run name or session id."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", text)[:48]
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


class BundleUrls(ServerUrls):
    """Relative links between the files of a static copy (``dressage-worker view bundle``).

    Layout: ``index.html`` (the run), ``sessions/*.html``, ``groups/*.html``, ``training.html``,
    ``steps/*.html``, ``sql/*.html``, ``artifacts/*``, ``static/``. Pages outside the bundle (other
    runs, filtered tables, fork trees) link to nothing.
    """

    live = False

    def __init__(self, run: str, depth: int, artifact_names: dict[int, str] | None = None) -> None:
        """``depth`` is how deep the page being rendered sits (0: ``index.html``)."""
        self._run = run
        self._up = "../" * depth
        self._artifacts = artifact_names or {}

    def static(self, path: str) -> str:
        return f"{self._up}static/{path}"

    def runs(self) -> str:
        return f"{self._up}index.html"

    def run(self, run: str, **params: object) -> str:
        return f"{self._up}index.html" if run == self._run and not params else "#not-in-bundle"

    def session(self, session_id: str) -> str:
        return f"{self._up}sessions/{file_name(session_id)}.html"

    def tree(self, session_id: str) -> str:
        return "#not-in-bundle"

    def sql(self, session_id: str) -> str:
        return f"{self._up}sql/{file_name(session_id)}.html"

    def group(self, run: str, group: int, diff: tuple[str, str] | None = None) -> str:
        return "#not-in-bundle" if diff else f"{self._up}groups/{int(group)}.html"

    def training(self, run: str) -> str:
        return f"{self._up}training.html"

    def compare(self, runs: list[str]) -> str:
        return "#not-in-bundle"

    def step(self, run: str, consumer: str, step: int) -> str:
        return f"{self._up}steps/{file_name(consumer)}-{int(step)}.html"

    def artifact(self, artifact_id: int, *, download: bool = False) -> str:
        name = self._artifacts.get(artifact_id)
        return f"{self._up}artifacts/{name}" if name else "#not-in-bundle"
