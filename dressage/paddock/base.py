"""The sandbox interface: what an agent's tools may do, independent of where they run.

A :class:`Sandbox` is one isolated workspace for one session. Commands run with the workspace as
their working directory; files are addressed relative to it. Providers (bubblewrap, E2B, plain local
processes) implement the same contract, and the same test suite runs against each of them.

Paths handed to :meth:`Sandbox.read_file`, :meth:`Sandbox.write_file` and
:meth:`Sandbox.list_files` are relative to the workspace. ``..`` components, absolute paths outside
the workspace and symlinks that resolve outside it are refused with :class:`SandboxError`, so a
caller (or a model) can never address host files through these methods.
"""

from __future__ import annotations

import abc
import asyncio
import io
import os
import posixpath
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from dressage.errors import SandboxError
from dressage.paddock.limits import DEFAULT_LIMITS, LimitsInForce

if TYPE_CHECKING:
    from dressage.paddock.checkpoints import Checkpointer, Manifest
    from dressage.store.artifacts import BlobStore

#: Where the workspace appears inside isolated sandboxes (bubblewrap); E2B uses its user's home.
WORKSPACE_MOUNT = "/workspace"


@dataclass(frozen=True)
class SandboxSpec:
    """How to build a sandbox. One spec serves every session of a run (it goes into the run config).

    ``memory_mb`` and ``max_processes`` are enforced by a mechanism ``limits`` accepts, or the
    sandbox is refused (bwrap; :mod:`dressage.paddock.limits`; e2b and local say what holds there); ``output_cap_bytes`` caps each of stdout and stderr of one
    :meth:`Sandbox.exec`. ``files`` seeds the workspace (relative path -> content) at creation.
    ``proxy_socket`` is a host Unix socket that is reachable inside the sandbox as
    ``http://127.0.0.1:<proxy_port>`` even when ``network`` is off (bubblewrap only).
    """

    provider: str = "bwrap"
    network: bool = False
    timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    memory_mb: int | None = 2048
    max_processes: int | None = 256
    #: Disk quota of the workspace and of ``/tmp`` in MiB (bwrap: see its module docstring).
    disk_mb: int | None = 1024
    output_cap_bytes: int = 64 * 1024
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    template: str | None = None
    proxy_socket: str | None = None
    proxy_port: int = 18080
    #: Seconds between SIGTERM and SIGKILL when a command times out or the sandbox terminates.
    kill_grace_s: float = 1.0
    #: Extra absolute paths inside the sandbox, each a directory of the workspace
    #: (``{"/tests": ".harbor/tests", "/app": "."}``). bwrap binds them read-write (the directories
    #: are created on the host before every command); e2b makes the path mounted from ``"."`` the
    #: workspace and the others symlinks into it. Harbor tasks use it for ``/tests``, ``/logs``,
    #: ``/solution`` and their working directory.
    mounts: Mapping[str, str] = field(default_factory=dict)
    #: bwrap only: a root filesystem directory used read-only as ``/`` instead of the host's
    #: ``/usr`` (a cached Debian rootfs built from a task's Dockerfile, see :mod:`dressage.harbor`).
    rootfs: str | None = None
    #: provider ``image`` only: the OCI image whose root filesystem, seen through a per-session
    #: copy-on-write overlay, is ``/`` (``docker://...``, ``oci:DIR[:TAG]``, ``oci-archive:TAR``,
    #: ``docker-archive:TAR``, ``containers-storage:[DRIVER@ROOT+RUNROOT]NAME``; see
    #: :mod:`dressage.paddock.image`).
    #: provider ``docker``: the engine's image reference each session's container runs
    #: (``python:3.12-slim``), pulled when the engine lacks it (:mod:`dressage.paddock.docker`).
    image: str | None = None
    #: bwrap: the mechanisms accepted for ``memory_mb`` / ``max_processes`` (``cgroup``, ``rlimit``);
    #: the strongest one this machine offers is used, or the sandbox is refused
    #: (:mod:`dressage.paddock.limits`).
    limits: tuple[str, ...] = DEFAULT_LIMITS


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command. Streams are decoded as UTF-8 (invalid bytes replaced) and capped.

    ``exit_code`` is the command's status; a command killed by signal N reports ``128 + N`` (so a
    timeout usually reads 137), matching what a shell would print.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 within its time limit."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class ExecRequest:
    """The arguments of one :meth:`Sandbox.exec` call, as a provider's :meth:`Sandbox._exec` gets them.

    ``timeout`` is the caller's (``None``: the spec's default); providers clamp it with
    :meth:`Sandbox._timeout` where they start the command.
    """

    cmd: str | list[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    timeout: float | None = None
    stdin: bytes | str | None = None

    @property
    def argv(self) -> list[str]:
        """The command as an argv: a string goes to ``/bin/sh -c``, a list is copied."""
        return ["/bin/sh", "-c", self.cmd] if isinstance(self.cmd, str) else list(self.cmd)

    def env_over(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the sandbox's ``spec.env``) overlaid with this call's ``env``."""
        return {**base, **(self.env or {})}


@dataclass(frozen=True)
class FileInfo:
    """One entry of a workspace directory listing; ``path`` is relative to the workspace."""

    name: str
    path: str
    is_dir: bool
    size: int


class Sandbox(abc.ABC):
    """One isolated workspace plus a way to run commands in it.

    Use it as an async context manager (``async with provider.create(...) as sb``) or call
    :meth:`terminate` yourself; terminate is idempotent and kills everything the sandbox started.
    """

    session_id: str
    spec: SandboxSpec
    _terminated: bool = False

    async def exec(
        self,
        cmd: str | list[str],
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes to ``/bin/sh -c``; a list is an argv) and wait for it.

        ``cwd`` is relative to the workspace. ``timeout`` defaults to ``spec.timeout_s`` and is
        clamped to ``spec.max_timeout_s``; on expiry the command and all its children are killed
        and ``timed_out`` is set. Never raises for a failing command, only for a broken sandbox.
        A terminated sandbox is refused here; the provider runs the command in :meth:`_exec`.
        """
        self._check()
        return await self._exec(ExecRequest(cmd, cwd, env, timeout, stdin))

    @abc.abstractmethod
    async def _exec(self, req: ExecRequest) -> ExecResult:
        """Run one command of a live sandbox with the contract of :meth:`exec`."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Return the bytes of a workspace file."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a workspace file (parent directories are created)."""

    @abc.abstractmethod
    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List one workspace directory (not recursive), sorted by name."""

    @abc.abstractmethod
    async def archive(self) -> bytes:
        """Return a tar.gz of the whole workspace (symlinks stored as links, never followed)."""

    @abc.abstractmethod
    async def terminate(self) -> None:
        """Kill every process of the sandbox and release its resources. Idempotent."""

    def writable_roots(self) -> dict[str, Path]:
        """The host folders that hold everything the sandbox's commands can change and that outlives
        a command, by name (``workspace``): what a checkpoint captures and restores
        (:mod:`dressage.paddock.checkpoints`). Providers whose state lives elsewhere refuse."""
        raise SandboxError(
            f"checkpoints are not built for sandbox provider {self.spec.provider!r}: its writable state "
            "is not a host folder (forks and take-overs replay instead)"
        )

    def restored(self) -> None:
        """Called after a checkpoint was restored into :meth:`writable_roots` (a provider that runs its
        commands as another host uid takes the files over here). Nothing to do by default."""
        return None

    #: True where a checkpoint keeps state outside the log's blobs (an E2B snapshot): retention hands
    #: the manifests it prunes to :meth:`drop_checkpoint`.
    checkpoints_outside: bool = False

    async def drop_checkpoint(self, manifest: Manifest) -> None:
        """Release what a pruned checkpoint keeps outside the log; nothing by default (its blobs are
        shared by content and stay)."""
        return None

    async def checkpoint(self, checkpointer: Checkpointer) -> Manifest:
        """This sandbox's writable state now, as a checkpoint manifest: by default ``checkpointer``
        walks :meth:`writable_roots` in a worker thread (the image sandbox adds its overlay, E2B
        takes a snapshot). Raises :class:`SandboxError` when there is none to take."""
        roots = self.writable_roots()
        return await asyncio.to_thread(checkpointer.capture, roots)

    async def restore_checkpoint(self, manifest: Manifest, blobs: BlobStore) -> None:
        """Make this fresh sandbox hold what ``manifest`` holds (:meth:`checkpoint`'s counterpart): by
        default its files are written into :meth:`writable_roots`, then :meth:`restored` runs."""
        from dressage.paddock.checkpoints import restore

        roots = self.writable_roots()
        await asyncio.to_thread(restore, manifest, roots, blobs)
        await asyncio.to_thread(self.restored)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.terminate()

    def _check(self) -> None:
        """Refuse to work on a terminated sandbox."""
        if self._terminated:
            raise SandboxError(f"sandbox {self.session_id} is terminated")

    def _timeout(self, timeout: float | None) -> float:
        """The effective wall-clock limit for one command."""
        t = self.spec.timeout_s if timeout is None else float(timeout)
        if t <= 0:
            raise SandboxError(f"timeout must be positive, got {t}")
        return min(t, self.spec.max_timeout_s)


class SandboxProvider(abc.ABC):
    """Creates sandboxes of one kind (``bwrap``, ``docker``, ``e2b``, ``local``)."""

    name: str

    async def remove_orphans(self) -> list[str]:
        """Remove what sandboxes of workers that died without cleaning up left running; their ids.

        Called when a worker starts. Nothing outlives a worker of most providers (bwrap's die with
        it); ``docker`` removes the containers of this host whose worker is gone."""
        return []

    @abc.abstractmethod
    async def create(self, session_id: str, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox for ``session_id`` with the workspace seeded from ``spec.files``."""

    @abc.abstractmethod
    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """What will enforce the memory and process limits of sandboxes of ``spec`` here.

        A run asks once before it starts (and records the answer); a provider that cannot enforce
        them as ``spec.limits`` accepts raises :class:`~dressage.errors.SandboxUnavailableError`
        with one line saying why, and from then on creates its sandboxes with that mechanism only.
        """


# --- helpers shared by providers that keep the workspace on the host --------------------------------


def relative_workspace_path(path: str, workspace: str = WORKSPACE_MOUNT) -> str:
    """Normalise a caller's path to one relative to the workspace, refusing escapes lexically.

    Accepts ``a/b``, ``./a`` and absolute paths under ``workspace`` (the in-sandbox mount); refuses
    ``..`` that climbs out, other absolute paths, and NUL bytes. Returns ``"."`` for the root.
    """
    if not isinstance(path, str) or "\x00" in path or path == "":
        raise SandboxError(f"invalid sandbox path {path!r}: give a non-empty path relative to the workspace")
    if posixpath.isabs(path):
        norm = posixpath.normpath(path)
        if norm != workspace and not norm.startswith(workspace.rstrip("/") + "/"):
            raise SandboxError(
                f"path {path!r} is outside the sandbox workspace {workspace}: use a relative path"
            )
        path = posixpath.relpath(norm, workspace)
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise SandboxError(f"path {path!r} escapes the sandbox workspace: '..' may not leave it")
    return norm


def resolve_in_workspace(root: Path, path: str) -> Path:
    """Map a workspace path onto the host directory ``root``, following symlinks, refusing escapes.

    The resolved target must stay inside ``root``; a symlink that points outside raises
    :class:`SandboxError`. (Resolution happens before the file is opened, so a process inside the
    sandbox that swaps a path for a symlink in between could race it; see the provider notes.)
    """
    rel = relative_workspace_path(path)
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath(real_root / rel))
    if target != real_root and real_root not in target.parents:
        raise SandboxError(f"path {path!r} resolves outside the sandbox workspace (symlink?): refused")
    return target


def host_read_file(root: Path, path: str) -> bytes:
    """Read a workspace file from the host side with escape checks."""
    target = resolve_in_workspace(root, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError as e:
        raise SandboxError(f"cannot read {path!r} in the sandbox workspace: {e.strerror}") from e


def host_write_file(root: Path, path: str, data: bytes | str) -> None:
    """Write a workspace file from the host side with escape checks (parents created)."""
    rel = relative_workspace_path(path)
    if rel == ".":
        raise SandboxError("cannot write to the workspace root itself: give a file path")
    parent = resolve_in_workspace(root, posixpath.dirname(rel) or ".")
    target = resolve_in_workspace(root, rel)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        # Re-check after mkdir: a component may have been a dangling symlink.
        resolve_in_workspace(root, posixpath.dirname(rel) or ".")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    except OSError as e:
        raise SandboxError(f"cannot write {path!r} in the sandbox workspace: {e.strerror}") from e


def host_list_files(root: Path, path: str) -> list[FileInfo]:
    """List a workspace directory from the host side with escape checks."""
    target = resolve_in_workspace(root, path)
    real_root = Path(os.path.realpath(root))
    try:
        entries = sorted(os.scandir(target), key=lambda e: e.name)
    except OSError as e:
        raise SandboxError(f"cannot list {path!r} in the sandbox workspace: {e.strerror}") from e
    out = []
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        out.append(
            FileInfo(
                name=entry.name,
                path=str(Path(entry.path).relative_to(real_root)),
                is_dir=entry.is_dir(follow_symlinks=False),
                size=st.st_size,
            )
        )
    return out


def host_archive(root: Path) -> bytes:
    """tar.gz of a host workspace directory; members are relative (``./a.txt``), links not followed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(root), arcname=".", recursive=True)
    return buf.getvalue()


def seed_workspace(root: Path, files: Mapping[str, bytes | str]) -> None:
    """Write ``spec.files`` into a fresh host workspace."""
    for rel, data in files.items():
        host_write_file(root, rel, data)


class HostWorkspaceSandbox(Sandbox):
    """A sandbox whose workspace is the host directory ``root``: files are handled host side.

    The file methods go through the ``host_*`` helpers above, so escapes are refused the same way
    for every such provider (``bwrap``, ``local``); subclasses implement :meth:`_exec` and
    :meth:`terminate`.
    """

    root: Path

    async def read_file(self, path: str) -> bytes:
        """Read a workspace file (host side, escapes refused)."""
        self._check()
        return host_read_file(self.root, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a workspace file (host side, escapes refused)."""
        self._check()
        host_write_file(self.root, path, data)

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List a workspace directory (host side, escapes refused)."""
        self._check()
        return host_list_files(self.root, path)

    async def archive(self) -> bytes:
        """tar.gz of the workspace."""
        self._check()
        return await asyncio.to_thread(host_archive, self.root)

    def writable_roots(self) -> dict[str, Path]:
        """The workspace, which is also the commands' ``HOME`` (``/tmp`` dies with each command)."""
        self._check()
        return {"workspace": self.root}
