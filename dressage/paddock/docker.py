"""The ``docker`` provider: one container of ``spec.image`` per session, in Docker or Podman.

For the machines where a container engine runs and bubblewrap over a task's own root filesystem is
not wanted (``sandbox: {provider: docker, image: python:3.12-slim}``). The engine's client is found
and called by :mod:`dressage.paddock.container_engine`.

What a session gets and what holds it:

- one container per session, started at :meth:`DockerProvider.create` (the image is pulled once per
  provider when the engine lacks it) and removed with everything in it at :meth:`DockerSandbox.terminate`.
  Its main process is a shell that sleeps; its stop signal is SIGKILL, so removal never waits.
- workspace: a host directory bound at ``/workspace`` (the working directory of commands; file calls
  go to it host side, escapes refused as for bwrap); ``spec.mounts`` are bound likewise. For an image
  whose user is not root, a root worker gives the workspace (and every file written later) to that
  user's uid and gid as ``id`` reads them inside: right for rootful engines, whose container ids are
  host ids.
- commands: ``<engine> exec`` per command, as the image's user, with the image's environment plus
  ``spec.env`` and the call's ``env`` (passed as ``-e NAME``, values in the client's environment, so
  no value shows on a command line). Each command is the leader of a session of its own inside
  (runc makes every exec one); when it exits, whatever it left running in that session is killed
  (as bwrap's PID namespace does). At the deadline every process of the session gets SIGTERM, after
  ``spec.kill_grace_s`` SIGKILL, and the client is killed (killing the client alone would leave the
  command running). A process that starts a session of its own escapes both until the sandbox ends.
- limits: ``--memory`` (swap included) and ``--pids-limit`` (the container's cgroup, whole
  container); :meth:`DockerProvider.limits_in_force` checks that a container of the image really gets
  them (rootless Podman on cgroup v1 ignores them) or refuses.
- disk (``spec.disk_mb``): ``/tmp`` is a tmpfs of that size, ``RLIMIT_FSIZE`` caps one file, and the
  workspace is measured before and after each command as bwrap does; the container's own writable
  layer (what a command writes outside ``/workspace`` and ``/tmp``) is not capped.
- network: ``--network none`` unless ``spec.network`` (then the engine's default network).
- proxy: the host's ``spec.proxy_socket`` is bound at ``/run/dressage/proxy.sock`` and the
  container's main process is :mod:`dressage.paddock._forwarder` on the image's ``python3``, listening
  on ``127.0.0.1:<proxy_port>`` inside; an image without ``python3`` is refused with that reason.
- privileges: the engine's default capability set, ``no-new-privileges``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

from dressage.errors import SandboxError, SandboxUnavailableError
from dressage.paddock import container_engine as ce
from dressage.paddock._proc import run_capped
from dressage.paddock.base import (
    WORKSPACE_MOUNT,
    ExecRequest,
    ExecResult,
    HostWorkspaceSandbox,
    SandboxProvider,
    SandboxSpec,
    relative_workspace_path,
    resolve_in_workspace,
    seed_workspace,
)
from dressage.paddock.bwrap import workspace_bytes
from dressage.paddock.limits import MIB, DiskQuota, LimitsInForce, configured_limits, refusal

PROXY_SOCKET_MOUNT = "/run/dressage/proxy.sock"
FORWARDER_MOUNT = "/run/dressage/forwarder.py"
_FORWARDER = Path(__file__).with_name("_forwarder.py")
_OVERHEAD_PROCS = 6  # the main shell and its sleep, each command's wrapper, the forwarder's threads
PULL_TIMEOUT_S = 1800.0
"""How long pulling an image may take (a cold multi-GB image over a slow registry)."""

_SLEEPER = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
"""The container's main process without a proxy: a shell that sleeps (and reaps orphans)."""
_WITH_FORWARDER = (
    "command -v python3 >/dev/null 2>&1 || { echo 'the image has no python3 to relay "
    "127.0.0.1:'\"$0\"' to the proxy socket (sandbox.proxy_port)' >&2; exit 97; }; "
    'exec python3 -I -S "$1" "$0" "$2" -- /bin/sh -c "$3"'
)
"""With a proxy: the forwarder (``$1``) listens on port ``$0`` and relays to socket ``$2``, then runs
the sleeper ``$3`` as its child."""
_WRAPPER = """echo $$ > "$0"
trap : TERM INT HUP
[ "$1" = - ] || ulimit -f "$1"
shift
"$@"
rc=$?
me=$$
for d in /proc/[0-9]*; do
  { read -r l < "$d/stat"; } 2>/dev/null || continue
  set -- ${l##*) }
  [ "$4" = "$me" ] && [ "${d#/proc/}" != "$me" ] && kill -9 "${d#/proc/}" 2>/dev/null
done
rm -f "$0"
exit $rc"""
"""Runs one command (``$@`` after ``$1``) as the leader of its exec session: writes its pid to the
file ``$0`` (how a timeout finds the session), caps one file at ``$1`` blocks of 512 bytes
(``RLIMIT_FSIZE``; ``-``: no cap), then kills what the command left running in the session. It
outlives a SIGTERM of the session (a handler, which the command does not inherit) to do that. (The
engines' ``--ulimit`` would replace their configured default rlimits, which some hosts need.)"""
_SIGNAL_SESSION = """p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] || exit 0
for d in /proc/[0-9]*; do
  { read -r l < "$d/stat"; } 2>/dev/null || continue
  set -- ${l##*) }
  [ "$4" = "$p" ] && kill -"$0" "${d#/proc/}" 2>/dev/null
done
exit 0"""
"""Sends signal ``$0`` to every process of the exec session whose leader's pid is in the file ``$1``."""
_READY = (
    'i=0; until [ -n "$(cat /proc/1/task/1/children 2>/dev/null)" ]; do '
    "i=$((i+1)); [ $i -ge 200 ] && exit 1; sleep 0.05; done"
)
"""Waits until the main process has its child: the forwarder starts it once it listens."""


class DockerSandbox(HostWorkspaceSandbox):
    """A container plus a host workspace bound into it; see the module doc."""

    def __init__(
        self,
        session_id: str,
        spec: SandboxSpec,
        engine: ce.Engine,
        container: str,
        root: Path,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.session_id = session_id
        self.spec = spec
        self.engine = engine
        self.container = container
        self.root = root
        self.owner = owner
        self._tasks: set[asyncio.Task[ExecResult]] = set()
        self._signals: set[asyncio.Task[ce.EngineResult]] = set()
        self._counter = itertools.count()
        self._terminated = False
        self._quota = DiskQuota(self.session_id, self.spec.disk_mb, lambda: workspace_bytes(self.root))

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a workspace file; where the image's user owns the workspace, the file (and new parents) too."""
        await super().write_file(path, data)
        if self.owner is not None:
            target = resolve_in_workspace(self.root, path)
            for p in [target, *target.parents]:
                if p == self.root:
                    break
                os.lchown(p, *self.owner)

    async def _exec(self, req: ExecRequest) -> ExecResult:
        """Run a command through ``<engine> exec`` in the session's container; see :meth:`Sandbox.exec`."""
        await asyncio.to_thread(self._quota.check)
        for rel in self.spec.mounts.values():
            resolve_in_workspace(self.root, rel).mkdir(parents=True, exist_ok=True)
        rel = relative_workspace_path(req.cwd or ".")
        if not resolve_in_workspace(self.root, rel).is_dir():
            raise SandboxError(f"working directory {req.cwd!r} does not exist in sandbox {self.session_id}")
        inner_cwd = WORKSPACE_MOUNT if rel == "." else f"{WORKSPACE_MOUNT}/{rel}"
        env = req.env_over(self.spec.env)
        if self.spec.proxy_socket:
            env["DRESSAGE_PROXY_URL"] = f"http://127.0.0.1:{self.spec.proxy_port}"
        pidfile = f"/dev/shm/.dressage-exec-{next(self._counter)}"
        argv = [self.engine.cli, "exec", *(["-i"] if req.stdin is not None else []), "-w", inner_cwd]
        for name in env:
            argv += ["-e", name]
        fsize = str(self.spec.disk_mb * MIB // 512) if self.spec.disk_mb else "-"
        argv += [self.container, "/bin/sh", "-c", _WRAPPER, pidfile, fsize, *req.argv]

        def send_signal(proc: asyncio.subprocess.Process, sig: int) -> None:
            self._signal_session(pidfile, sig)
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)

        task = asyncio.ensure_future(
            run_capped(
                argv,
                env=ce.client_env(env),
                cwd=None,
                stdin=req.stdin,
                timeout=self._timeout(req.timeout),
                cap=self.spec.output_cap_bytes,
                grace=self.spec.kill_grace_s,
                send_signal=send_signal,
            )
        )
        self._tasks.add(task)
        try:
            result = await task
        except asyncio.CancelledError:
            if not self._terminated:
                raise
        finally:
            self._tasks.discard(task)
        if self._terminated:
            raise SandboxError(f"sandbox {self.session_id} was terminated while a command ran")
        if self._signals:  # a timed-out command: its session is dead before the result returns
            await asyncio.wait(set(self._signals), timeout=ce.ENGINE_TIMEOUT_S)
        await asyncio.to_thread(self._quota.check)
        return result

    def _signal_session(self, pidfile: str, sig: int) -> None:
        """Send ``sig`` to every process of one command's session inside (a task; awaited by ``_exec``)."""
        t = asyncio.ensure_future(
            ce.call(self.engine, "exec", self.container, "/bin/sh", "-c", _SIGNAL_SESSION, str(sig), pidfile)
        )
        self._signals.add(t)
        t.add_done_callback(self._signals.discard)

    async def terminate(self) -> None:
        """Remove the container (killing everything in it) and the workspace. Idempotent."""
        if self._terminated:
            return
        self._terminated = True
        try:
            await ce.remove_containers(self.engine, [self.container])
        finally:
            for t in list(self._tasks):
                t.cancel()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=5)
            await asyncio.to_thread(shutil.rmtree, self.root.parent, True)


class DockerProvider(SandboxProvider):
    """Creates :class:`DockerSandbox` instances; workspaces under ``root_dir`` (default: the temp dir).

    ``run`` labels the containers with the run they belong to (the worker passes its run's name)."""

    name = "docker"

    def __init__(self, root_dir: str | Path | None = None, run: str | None = None) -> None:
        self.root_dir = Path(root_dir) if root_dir else None
        self.run = run
        self._owner = ce.owner_label()
        self._images: dict[str, asyncio.Lock] = {}
        self._present: set[str] = set()
        self._users: dict[str, str] = {}  # image -> its configured user

    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """Start a container of ``spec.image`` with the limits and read them back from its cgroup;
        refuse with one line where the engine does not apply them."""
        image = _image(spec)
        engine = await ce.find_engine()
        wanted = configured_limits(spec.memory_mb, spec.max_processes)
        if not wanted:
            return LimitsInForce("none", "sandbox.memory_mb and max_processes are null")
        await self.ensure_image(engine, image)
        flags = [*self._labels("limits-probe"), "--rm", "--network", "none", *_limit_flags(spec)]
        probe = (
            "cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory.max "
            "/sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; true"
        )
        r = await ce.call(engine, "run", *flags, "--entrypoint", "/bin/sh", image, "-c", probe)
        seen = set(r.out.split())
        procs = None if spec.max_processes is None else spec.max_processes + _OVERHEAD_PROCS
        missing = [f"pids.max {procs}"] if procs is not None and str(procs) not in seen else []
        if spec.memory_mb is not None and str(spec.memory_mb * MIB) not in seen:
            missing.append(f"memory {spec.memory_mb} MiB")
        if r.rc != 0 or missing:
            why = (
                r.err.strip().splitlines()[-1] if r.rc != 0 and r.err.strip() else f"it shows {sorted(seen)}"
            )
            raise refusal(
                wanted,
                spec.limits,
                f"the container's cgroup to hold {', '.join(missing) or 'them'}, and a {engine.kind} "
                f"container of {image} does not get them ({why})",
                f"run {engine.kind} where it manages cgroups (rootful, or rootless on cgroup v2)",
            )
        parts = [f"--pids-limit {procs}"] if procs is not None else []
        parts += [f"--memory {spec.memory_mb} MiB"] if spec.memory_mb is not None else []
        return LimitsInForce(
            "cgroup", f"{engine.kind} container cgroup: {', '.join(parts)} for the whole container"
        )

    async def ensure_image(self, engine: ce.Engine, image: str) -> None:
        """Pull ``image`` unless the engine has it (once per provider and image, however many ask)."""
        if image in self._present:
            return
        async with self._images.setdefault(image, asyncio.Lock()):
            if image in self._present:
                return
            if (await ce.call(engine, "image", "inspect", "--format", "{{.Id}}", image)).rc != 0:
                r = await ce.call(engine, "pull", "--quiet", image, timeout=PULL_TIMEOUT_S)
                if r.rc != 0:
                    err = (r.err.strip().splitlines() or ["no output"])[-1]
                    raise SandboxError(f"sandbox.image {image!r}: {engine.kind} cannot pull it: {err}")
            self._present.add(image)

    async def create(self, session_id: str, spec: SandboxSpec) -> DockerSandbox:
        """Pull the image if needed, make and seed the workspace, start the session's container."""
        image = _image(spec)
        engine = await ce.find_engine()
        if spec.proxy_socket and not os.path.exists(spec.proxy_socket):
            raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist: start the forwarder first")
        await self.ensure_image(engine, image)
        root = await asyncio.to_thread(self._workspace, spec)
        name = f"dressage-{uuid.uuid4().hex[:16]}"
        try:
            await self._start(engine, name, session_id, spec, root)
            owner = await self._hand_workspace(engine, name, image, root)
        except BaseException:
            with contextlib.suppress(SandboxError):
                await ce.remove_containers(engine, [name])
            await asyncio.to_thread(shutil.rmtree, root.parent, True)
            raise
        return DockerSandbox(session_id, spec, engine, name, root, owner)

    async def _hand_workspace(
        self, engine: ce.Engine, name: str, image: str, root: Path
    ) -> tuple[int, int] | None:
        """For an image whose user is not root: give the workspace to that user's uid and gid (read
        inside the container); None for root. The host folder is chowned, which holds where the
        engine maps container ids to the same host ids (rootful); a rootless engine maps them
        elsewhere, and a worker that is not root cannot chown: the folder stays the worker's."""
        if image not in self._users:
            r = await ce.call(engine, "image", "inspect", "--format", "{{.Config.User}}", image)
            self._users[image] = r.out.strip() if r.rc == 0 else ""
        if self._users[image] in ("", "0", "root", "0:0", "root:root") or os.geteuid() != 0:
            return None
        ids = await ce.call(engine, "exec", name, "/bin/sh", "-c", "id -u; id -g")
        try:
            uid, gid = (int(x) for x in ids.out.split())
        except ValueError:
            raise SandboxError(
                f"cannot read the uid of user {self._users[image]!r} of image {image} (id -u; id -g said "
                f"{_last(ids.err or ids.out)!r}): the workspace could not be made theirs"
            ) from None
        await asyncio.to_thread(hand_over_tree, root, uid, gid)
        return uid, gid

    async def _start(
        self, engine: ce.Engine, name: str, session_id: str, spec: SandboxSpec, root: Path
    ) -> None:
        """``<engine> run -d`` the session's container; with a proxy, wait until its forwarder listens."""
        flags = ["-d", "--name", name, *self._labels(session_id), *_limit_flags(spec)]
        flags += ["--hostname", "sandbox", "--label", f"{ce.LABEL_WORKSPACE}={root.parent}"]
        flags += ["--stop-signal", "SIGKILL", "--security-opt", "no-new-privileges", "-w", WORKSPACE_MOUNT]
        flags += [] if spec.network else ["--network", "none"]  # with network: the engine's default one
        if spec.disk_mb:
            flags += ["--tmpfs", f"/tmp:rw,size={spec.disk_mb}m,mode=1777"]
        flags += ["-v", f"{root}:{WORKSPACE_MOUNT}"]
        for inside, rel in sorted(spec.mounts.items()):
            flags += ["-v", f"{resolve_in_workspace(root, rel)}:{inside}"]
        args = ["-c", _SLEEPER]
        if spec.proxy_socket:
            flags += [
                "-v",
                f"{spec.proxy_socket}:{PROXY_SOCKET_MOUNT}",
                "-v",
                f"{_FORWARDER}:{FORWARDER_MOUNT}:ro",
            ]
            args = [
                "-c",
                _WITH_FORWARDER,
                str(spec.proxy_port),
                FORWARDER_MOUNT,
                PROXY_SOCKET_MOUNT,
                _SLEEPER,
            ]
        r = await ce.call(engine, "run", *flags, "--entrypoint", "/bin/sh", _image(spec), *args)
        if r.rc != 0:
            raise SandboxError(f"cannot start a {engine.kind} container of {_image(spec)}: {_last(r.err)}")
        if spec.proxy_socket:
            ready = await ce.call(engine, "exec", name, "/bin/sh", "-c", _READY)
            if ready.rc != 0:
                logs = await ce.call(engine, "logs", name)
                raise SandboxError(
                    f"the {engine.kind} container of {_image(spec)} did not come up: {_last(logs.err or ready.err)}"
                )

    def _labels(self, session_id: str) -> list[str]:
        """``--label`` flags naming the provider, run, session and owning worker (orphan removal)."""
        labels = {ce.LABEL_SANDBOX: "1", ce.LABEL_SESSION: session_id, ce.LABEL_OWNER: self._owner}
        if self.run:
            labels[ce.LABEL_RUN] = self.run
        return [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]

    def _workspace(self, spec: SandboxSpec) -> Path:
        """Make ``<base>/workspace`` seeded with ``spec.files`` (removed again on failure)."""
        if self.root_dir:
            self.root_dir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="dressage-docker-", dir=self.root_dir))
        try:
            root = base / "workspace"
            root.mkdir()
            seed_workspace(root, spec.files)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        return root

    async def remove_orphans(self) -> list[str]:
        """Remove this host's sandbox containers whose worker is gone (killed before its cleanup)."""
        return await ce.remove_orphans(await ce.find_engine())


def hand_over_tree(root: Path, uid: int, gid: int) -> None:
    """Make ``root`` and everything under it ``uid:gid``'s; links are not followed."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _image(spec: SandboxSpec) -> str:
    """The spec's image, or the one-line refusal naming the field."""
    if not spec.image:
        raise SandboxUnavailableError("sandbox provider docker needs sandbox.image (e.g. python:3.12-slim)")
    return spec.image


def _limit_flags(spec: SandboxSpec) -> list[str]:
    """The engine flags of the spec's memory and process limits."""
    flags = []
    if spec.memory_mb is not None:
        flags += ["--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m"]
    if spec.max_processes is not None:
        flags += ["--pids-limit", str(spec.max_processes + _OVERHEAD_PROCS)]
    return flags


def _last(err: str) -> str:
    """The last line an engine printed on stderr (its error), or a placeholder."""
    lines = err.strip().splitlines()
    return lines[-1] if lines else "no error output"
