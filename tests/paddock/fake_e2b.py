"""A local fake of E2B's wire protocol, for testing the ``e2b`` provider without the cloud.

One real HTTP/1.1 server (uvicorn) on loopback serves both planes; the SDK is pointed at it with
``api_url`` and ``sandbox_url``:

- control plane REST: ``POST /v2/sandboxes`` (201 + sandbox JSON; a ``templateID`` naming a
  snapshot starts from a copy of it), ``DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/snapshots``
  (201 + ``snapshotID``/``names``: a copy of the sandbox's directory; running processes are not kept,
  unlike E2B's memory snapshots) and ``DELETE /templates/{id}`` (a snapshot: 204, 404 when unknown);
- envd: ``GET /health``, ``GET|POST /files`` (download / multipart or octet-stream upload), and the
  Connect-RPC services ``process.Process`` (``Start``, server streaming) and
  ``filesystem.Filesystem`` (``ListDir``, ``Remove``) served by the SDK's own generated ASGI
  applications and protobuf classes.

A sandbox is a temp directory standing in for ``/home/user``; the sandbox is chosen by the
``E2b-Sandbox-Id`` header the SDK sends. Commands run as real host processes there (no isolation:
this is a protocol fake, not a sandbox), and paths outside ``/home/user`` are refused.

``FakeE2B(vm=True)`` stands in for a VM's whole filesystem instead: the temp directory is the VM's
``/`` (``/home/user`` is ``<dir>/home/user``, ``/app`` is ``<dir>/app``), every absolute path is
served, and each command runs under bubblewrap with that directory as its root (the host's ``/usr``
and ``/etc`` bound read-only in it), so what a command writes anywhere persists like on a VM. The
``user`` a command runs as (E2B's ``root`` or ``user``) is recorded in ``users`` and otherwise ignored.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.parser
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from protobuf import Oneof

from tests.loopback import ThreadedServer

HOME = "/home/user"
ENVD_VERSION = "0.6.0"


class _State:
    def __init__(self, vm: bool = False) -> None:
        self.vm = vm
        self.roots: dict[str, Path] = {}
        self.procs: dict[str, set[asyncio.subprocess.Process]] = {}
        self.created: list[dict] = []
        self.users: list[str] = []
        self.snapshots: dict[str, Path] = {}
        self.snapshot_requests: list[dict] = []

    def root(self, sandbox_id: str | None) -> Path:
        if not sandbox_id or sandbox_id not in self.roots:
            raise ConnectError(Code.NOT_FOUND, f"sandbox {sandbox_id} not found")
        return self.roots[sandbox_id]

    def new_root(self, root: Path) -> None:
        """Lay out a fresh sandbox directory (in VM mode: a root filesystem over the host's /usr)."""
        if not self.vm:
            return
        for d in ("home/user", "tmp", "usr", "etc", "proc", "dev"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for name in ("bin", "lib", "lib64", "sbin"):
            host = Path("/") / name
            if host.is_symlink():
                (root / name).symlink_to(os.readlink(host))

    def inner(self, sandbox_id: str | None, host: Path) -> str:
        """The in-sandbox path of a host path under the sandbox's directory."""
        rel = os.path.relpath(host, self.root(sandbox_id))
        return os.path.normpath("/" + rel) if self.vm else os.path.join(HOME, rel)

    def map(self, sandbox_id: str | None, path: str) -> Path:
        root = self.root(sandbox_id)
        norm = os.path.normpath(path if os.path.isabs(path) else os.path.join(HOME, path))
        if self.vm:
            return root / norm.lstrip("/")
        if norm != HOME and not norm.startswith(HOME + "/"):
            raise ConnectError(Code.PERMISSION_DENIED, f"fake e2b only serves {HOME}, not {path}")
        return root / os.path.relpath(norm, HOME)

    def argv(self, sandbox_id: str | None, cwd: str, cmd: str, args: list[str]) -> tuple[list[str], Path]:
        """The host argv and working directory of a command (in VM mode: under bubblewrap)."""
        if not self.vm:
            return [cmd, *args], self.map(sandbox_id, cwd)
        from dressage.paddock.bwrap import find_bwrap

        root = self.root(sandbox_id)
        inside = os.path.normpath(cwd if os.path.isabs(cwd) else os.path.join(HOME, cwd))
        wrap = [
            find_bwrap(),
            "--bind",
            str(root),
            "/",
            "--ro-bind",
            "/usr",
            "/usr",
            "--ro-bind",
            "/etc",
            "/etc",
        ]
        wrap += ["--proc", "/proc", "--dev", "/dev", "--die-with-parent", "--chdir", inside, "--"]
        return [*wrap, cmd, *args], root


class _Unimplemented:
    """Every RPC the fake does not serve answers UNIMPLEMENTED (the generated app wants them all)."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        async def handler(*_args: object) -> None:
            raise ConnectError(Code.UNIMPLEMENTED, f"fake e2b does not implement {name}")

        return handler


def _sid(ctx) -> str | None:
    return ctx.request_headers.get("e2b-sandbox-id")


def _user(ctx) -> str:
    """The user the SDK asks to run as (HTTP basic auth ``user:``), ``default`` when none."""
    auth = ctx.request_headers.get("authorization") or ""
    if not auth.lower().startswith("basic "):
        return "default"
    return base64.b64decode(auth[6:]).decode(errors="replace").split(":", 1)[0]


class _Process(_Unimplemented):
    """process.Process: only Start is needed by ``commands.run``."""

    def __init__(self, state: _State) -> None:
        self.state = state

    async def start(self, request: process_pb.StartRequest, ctx) -> AsyncIterator[process_pb.StartResponse]:
        sid = _sid(ctx)
        cfg = request.process
        self.state.users.append(_user(ctx))
        home = HOME if self.state.vm else str(self.state.root(sid))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
        env.update(dict(cfg.envs))
        args = [a.replace("-l", "--noprofile") if a == "-l" else a for a in cfg.args]
        argv, cwd = self.state.argv(sid, cfg.cwd or HOME, cfg.cmd, args)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.state.procs.setdefault(sid or "", set()).add(proc)
        ev = process_pb.ProcessEvent
        yield process_pb.StartResponse(event=ev(event=Oneof("start", ev.StartEvent(pid=proc.pid))))
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader, name: str) -> None:
            while chunk := await stream.read(65536):
                await queue.put((name, chunk))
            await queue.put((name, b""))

        tasks = [
            asyncio.create_task(pump(proc.stdout, "stdout")),
            asyncio.create_task(pump(proc.stderr, "stderr")),
        ]
        try:
            open_streams = 2
            while open_streams:
                name, chunk = await queue.get()
                if not chunk:
                    open_streams -= 1
                    continue
                data = ev.DataEvent(output=Oneof(name, chunk))
                yield process_pb.StartResponse(event=ev(event=Oneof("data", data)))
            code = await proc.wait()
            end = ev.EndEvent(exit_code=code if code >= 0 else 128 - code, exited=code >= 0, status="exited")
            yield process_pb.StartResponse(event=ev(event=Oneof("end", end)))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for t in tasks:
                t.cancel()


class _Filesystem(_Unimplemented):
    """filesystem.Filesystem: ListDir and Remove."""

    def __init__(self, state: _State) -> None:
        self.state = state

    async def list_dir(self, request: filesystem_pb.ListDirRequest, ctx) -> filesystem_pb.ListDirResponse:
        target = self.state.map(_sid(ctx), request.path)
        if not target.is_dir():
            raise ConnectError(Code.NOT_FOUND, f"directory {request.path} not found")
        entries = []
        for p in sorted(target.iterdir()):
            st = p.lstat()
            ftype = filesystem_pb.FileType.DIRECTORY if p.is_dir() else filesystem_pb.FileType.FILE
            inner = self.state.inner(_sid(ctx), p)
            entries.append(filesystem_pb.EntryInfo(name=p.name, type=ftype, path=inner, size=st.st_size))
        return filesystem_pb.ListDirResponse(entries=entries)

    async def remove(self, request: filesystem_pb.RemoveRequest, ctx) -> filesystem_pb.RemoveResponse:
        target = self.state.map(_sid(ctx), request.path)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        return filesystem_pb.RemoveResponse()


async def _send(send, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _body(receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


def _err(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"code": status, "message": message}).encode()


class FakeE2B:
    """Context manager running the fake on ``127.0.0.1:<free port>``; ``.url`` is its base URL."""

    def __init__(self, vm: bool = False) -> None:
        self.state = _State(vm)
        self.base = Path(tempfile.mkdtemp(prefix="fake-e2b-"))
        self._process_app = ProcessASGIApplication(_Process(self.state))
        self._fs_app = FilesystemASGIApplication(_Filesystem(self.state))
        # asyncio, not uvloop: uvloop spawning a child from a loop in a non-main thread can leave the
        # forked child stuck before exec (a futex), seen once in the default tier (docs/test-speed.md)
        self._http = ThreadedServer(self, lifespan="off", loop="asyncio")
        self.port = self._http.port
        self.url = self._http.base

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry: Connect-RPC services by path prefix, the REST routes otherwise."""
        path = scope["path"]
        if path.startswith("/process.Process/"):
            return await self._process_app(scope, receive, send)
        if path.startswith("/filesystem.Filesystem/"):
            return await self._fs_app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = dict(
            kv.split("=", 1) if "=" in kv else (kv, "")
            for kv in scope.get("query_string", b"").decode().split("&")
            if kv
        )
        from urllib.parse import unquote

        query = {k: unquote(v) for k, v in query.items()}
        method = scope["method"]
        body = await _body(receive)
        status, out, ctype = 404, b'{"code":404,"message":"no route"}', "application/json"
        try:
            status, out, ctype = self._rest(method, path, headers, query, body)
        except ConnectError as e:
            status, out = _err(404 if e.code == Code.NOT_FOUND else 403, e.message)
        await _send(send, status, out, ctype)

    def _rest(
        self, method: str, path: str, headers: dict, query: dict, body: bytes
    ) -> tuple[int, bytes, str]:
        js = "application/json"
        if method == "POST" and path == "/v2/sandboxes":
            if not headers.get("x-api-key"):
                return (*_err(401, "missing API key"), js)
            req = json.loads(body or b"{}")
            self.state.created.append(req)
            sid = "fake" + uuid.uuid4().hex[:12]
            root = self.base / sid
            snapshot = self.state.snapshots.get(req.get("templateID", ""))
            if snapshot is not None:
                shutil.copytree(snapshot, root, symlinks=True)
            else:
                root.mkdir()
                self.state.new_root(root)
            self.state.roots[sid] = root
            resp = {
                "templateID": req.get("templateID", "base"),
                "sandboxID": sid,
                "clientID": "fake",
                "envdVersion": ENVD_VERSION,
            }
            return 201, json.dumps(resp).encode(), js
        if method == "POST" and path.startswith("/sandboxes/") and path.endswith("/snapshots"):
            return self._snapshot(path.split("/")[2], json.loads(body or b"{}"))
        if method == "DELETE" and path.startswith("/templates/"):
            snap = self.state.snapshots.pop(path.split("/", 2)[2], None)
            if snap is None:
                return (*_err(404, "snapshot not found"), js)
            shutil.rmtree(snap, ignore_errors=True)
            return 204, b"", js
        if method == "DELETE" and path.startswith("/sandboxes/"):
            sid = path.rsplit("/", 1)[1]
            if sid not in self.state.roots:
                return (*_err(404, f"sandbox {sid} not found"), js)
            for p in self.state.procs.pop(sid, set()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            shutil.rmtree(self.state.roots.pop(sid), ignore_errors=True)
            return 204, b"", js
        if path == "/health":
            return 204, b"", js
        if path == "/files":
            sid = headers.get("e2b-sandbox-id")
            if method == "GET":
                target = self.state.map(sid, query.get("path", ""))
                if not target.is_file():
                    return (*_err(404, f"file {query.get('path')} not found"), js)
                return 200, target.read_bytes(), "application/octet-stream"
            if method == "POST":
                written = []
                ctype = headers.get("content-type", "")
                if ctype.startswith("multipart/form-data"):
                    msg = email.parser.BytesParser().parsebytes(
                        f"Content-Type: {ctype}\r\n\r\n".encode() + body
                    )
                    parts = [
                        (p.get_filename() or query.get("path", ""), p.get_payload(decode=True))
                        for p in msg.get_payload()
                    ]
                else:
                    parts = [(query.get("path", ""), body)]
                for name, data in parts:
                    target = self.state.map(sid, name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data or b"")
                    written.append({"name": target.name, "type": "file", "path": name})
                return 200, json.dumps(written).encode(), js
        return (*_err(404, f"no route {method} {path}"), js)

    def _snapshot(self, sid: str, req: dict) -> tuple[int, bytes, str]:
        """``POST /sandboxes/{id}/snapshots``: copy the sandbox's directory; the snapshot's id."""
        js = "application/json"
        if sid not in self.state.roots:
            return (*_err(404, f"sandbox {sid} not found"), js)
        self.state.snapshot_requests.append(req)
        snap_id = f"snap{uuid.uuid4().hex[:12]}:default"
        target = self.base / "snapshots" / snap_id.replace(":", "_")
        shutil.copytree(self.state.roots[sid], target, symlinks=True)
        self.state.snapshots[snap_id] = target
        return 201, json.dumps({"snapshotID": snap_id, "names": [f"fake/{snap_id}"]}).encode(), js

    def __enter__(self) -> FakeE2B:
        self._http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.stop()
        shutil.rmtree(self.base, ignore_errors=True)
