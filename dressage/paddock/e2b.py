"""The ``e2b`` provider: E2B cloud sandboxes (Firecracker microVMs) through the ``e2b`` SDK 2.x.

Isolation is E2B's (a VM per sandbox); this module only maps the :class:`Sandbox` contract onto the
SDK. Differences from ``bwrap`` worth knowing:

- the workspace is ``/home/user`` (E2B's default user home), configurable as ``workdir``;
- memory, process and disk limits come from the E2B template (CPU/RAM/disk are set when building
  it), not from ``spec.memory_mb`` / ``spec.max_processes`` / ``spec.disk_mb``;
- ``spec.network=False`` maps to ``allow_internet_access=False`` (E2B enforces it in the VM);
- ``spec.mounts`` (Harbor tasks' fixed paths): the VM has its own filesystem, so instead of bind
  mounts the mount whose source is ``"."`` becomes the workspace (e.g. ``/app``) and every other
  in-sandbox path becomes a symlink to its workspace directory (``/tests -> /app/.harbor/tests``),
  created as root when the VM starts; the caller's code is the same as on ``bwrap``
  (:func:`link_mounts_command`);
- ``spec.rootfs`` (a bubblewrap root filesystem) and ``spec.image`` are refused: on E2B a task image is an E2B
  template (``spec.template``);
- ``spec.proxy_socket`` is not supported: a cloud VM cannot reach a host Unix socket (expose the
  proxy on a URL the VM can reach instead) -> :class:`NotSupportedError`;
- the time limit is enforced inside the VM with coreutils ``timeout -k`` (SIGTERM, then SIGKILL to
  the command's process group), with the SDK's stream timeout as a backstop;
- the symlink check of file paths is lexical only (the VM is the boundary anyway).

Checkpoints (docs/rollout.md, "Checkpoints") are E2B snapshots: :meth:`E2BSandbox.checkpoint` calls
the SDK's ``create_snapshot`` (the VM pauses while it is taken, then goes on; memory and filesystem
are kept) and records the snapshot's id as the manifest's one ``snapshot`` entry;
:meth:`E2BSandbox.restore_checkpoint` starts a VM from that snapshot (``AsyncSandbox.create`` with
the snapshot as its template) and kills the fresh one it replaces. Snapshots outlive their
sandboxes; retention (``checkpoints.keep``) deletes the snapshots of the checkpoints it prunes
(:meth:`E2BSandbox.drop_checkpoint`, ``delete_snapshot``).

Set ``E2B_API_KEY`` (or pass ``api_key``). ``api_url`` / ``sandbox_url`` point the SDK at another
control plane / envd (the tests use a local fake speaking E2B's wire protocol).
"""

from __future__ import annotations

import posixpath
import shlex
import time
import uuid
from collections.abc import Mapping
from typing import Any

from dressage.config import load_settings
from dressage.errors import NotSupportedError, SandboxError, SandboxUnavailableError
from dressage.paddock.base import (
    ExecRequest,
    ExecResult,
    FileInfo,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    relative_workspace_path,
)
from dressage.paddock.checkpoints import CaptureStats, Checkpointer, CheckpointError, Entry, Manifest
from dressage.paddock.limits import LimitsInForce
from dressage.store.artifacts import BlobStore

DEFAULT_WORKDIR = "/home/user"
SNAPSHOT_ROOT = "vm"
"""The checkpoint root of an E2B sandbox: its whole VM, kept as a snapshot."""


def mounts_workdir(mounts: Mapping[str, str], default: str) -> str:
    """The workspace of a sandbox with ``mounts``: the path mounted from ``"."``, else ``default``."""
    return next((target for target, source in mounts.items() if source == "."), default)


def link_mounts_command(mounts: Mapping[str, str], workdir: str) -> str | None:
    """The root shell command that realises ``spec.mounts`` in a VM: workspace directories + symlinks.

    Each in-sandbox path that is not the workspace is replaced by a symlink to its directory in the
    workspace (created first), and the workspace is handed to E2B's ``user`` where that user exists.
    """
    if posixpath.normpath(workdir) == "/":
        raise SandboxError("an E2B workspace cannot be the VM's root '/': give the task another workdir")
    links = {t: s for t, s in mounts.items() if s != "."}
    if not links and workdir == DEFAULT_WORKDIR:
        return None
    parts = [f"mkdir -p {shlex.quote(workdir)}"]
    for target, source in sorted(links.items()):
        inside = posixpath.join(workdir, relative_workspace_path(source, workdir))
        t = shlex.quote(target.rstrip("/") or "/")
        parts.append(f"mkdir -p {shlex.quote(inside)} {shlex.quote(posixpath.dirname(target) or '/')}")
        parts.append(f"rm -rf {t} && ln -s {shlex.quote(inside)} {t}")
    parts.append(f"if id user >/dev/null 2>&1; then chown -R user:user {shlex.quote(workdir)}; fi")
    return " && ".join(parts)


class _Capped:
    """Collects streamed output up to a byte cap (E2B streams text chunks)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.truncated = False

    def __call__(self, chunk: str) -> None:
        data = chunk.encode("utf-8", errors="replace")
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += data[:room]
        if len(data) > room:
            self.truncated = True

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


class E2BSandbox(Sandbox):
    """One E2B sandbox; see the module docstring for what maps to what."""

    def __init__(
        self, session_id: str, spec: SandboxSpec, sbx: Any, workdir: str, provider: E2BProvider | None = None
    ) -> None:
        self.session_id = session_id
        self.spec = spec
        self.sbx = sbx
        self.workdir = workdir
        self._provider = provider
        self._terminated = False

    checkpoints_outside = True

    async def drop_checkpoint(self, manifest: Manifest) -> None:
        """Delete a pruned checkpoint's snapshot from E2B (:func:`delete_checkpoint`)."""
        if self._provider is not None:
            await delete_checkpoint(self._provider, manifest)

    async def checkpoint(self, checkpointer: Checkpointer) -> Manifest:
        """A snapshot of the whole VM (``create_snapshot``), its id the manifest's one entry; the
        checkpointer's caps and blob store are not used (E2B keeps the snapshot)."""
        from e2b import SandboxException

        self._check()
        checkpointer.last_stats = CaptureStats()
        try:
            snap = await self.sbx.create_snapshot()
        except SandboxException as e:
            raise CheckpointError(f"e2b sandbox {self.session_id}: create_snapshot failed: {e}") from e
        return Manifest((SNAPSHOT_ROOT,), (Entry(SNAPSHOT_ROOT, "snapshot", target=snap.snapshot_id),))

    async def restore_checkpoint(self, manifest: Manifest, blobs: BlobStore) -> None:
        """Replace this fresh VM with one started from the checkpoint's snapshot (same template
        settings, environment and network; the snapshot holds the files, links and workspace)."""
        self._check()
        snapshot = snapshot_id(manifest)
        if self._provider is None:
            raise CheckpointError(f"e2b sandbox {self.session_id} was not made by a provider: cannot restore")
        fresh = await self._provider.start_vm(self.session_id, self.spec, snapshot)
        old, self.sbx = self.sbx, fresh
        from e2b import SandboxException

        try:
            await old.kill()
        except SandboxException as e:
            raise SandboxError(f"could not kill the replaced e2b sandbox of {self.session_id}: {e}") from e

    def _abs(self, path: str) -> str:
        rel = relative_workspace_path(path, self.workdir)
        return self.workdir if rel == "." else posixpath.join(self.workdir, rel)

    async def _exec(self, req: ExecRequest) -> ExecResult:
        """Run a command through envd under ``timeout -k``; see :meth:`Sandbox.exec`."""
        from e2b import CommandExitException, SandboxException, TimeoutException

        limit = self._timeout(req.timeout)
        line = req.cmd if isinstance(req.cmd, str) else shlex.join(req.cmd)
        stdin_file = None
        workdir = self._abs(req.cwd or ".")
        stdin = req.stdin
        if stdin is not None:
            stdin_file = f"{self.workdir}/.dressage-stdin-{uuid.uuid4().hex}"
            await self.sbx.files.write(stdin_file, stdin.encode() if isinstance(stdin, str) else stdin)
            # Relative to the command's cwd, so it holds whatever the VM calls the workspace.
            line = f"( {line} ) < {shlex.quote(posixpath.relpath(stdin_file, workdir))}"
        grace = max(1, round(self.spec.kill_grace_s))
        wrapped = f"timeout -k {grace} {limit:g} /bin/sh -c {shlex.quote(line)}"
        out, err = _Capped(self.spec.output_cap_bytes), _Capped(self.spec.output_cap_bytes)
        started = time.monotonic()
        timed_out = False
        try:
            res = await self.sbx.commands.run(
                wrapped,
                cwd=workdir,
                envs=req.env_over(self.spec.env),
                timeout=limit + grace + 10,
                on_stdout=out,
                on_stderr=err,
                retain_output=False,
            )
            code = res.exit_code
        except CommandExitException as e:
            code = e.exit_code
        except TimeoutException:
            code, timed_out = 137, True
        except SandboxException as e:
            raise SandboxError(f"e2b sandbox {self.session_id}: command failed to run: {e}") from e
        finally:
            if stdin_file is not None and not self._terminated:
                try:
                    await self.sbx.files.remove(stdin_file)
                except SandboxException:
                    pass
        duration = time.monotonic() - started
        if code in (124, 137) and duration >= limit * 0.95:
            timed_out, code = True, 137
        return ExecResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=code,
            timed_out=timed_out,
            duration_s=duration,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    async def run_as_root(self, line: str, timeout: float = 60.0) -> None:
        """Run one setup command as the VM's root (outside the workspace); raise if it fails."""
        from e2b import CommandExitException, SandboxException

        self._check()
        try:
            await self.sbx.commands.run(line, user="root", cwd="/", timeout=timeout)
        except CommandExitException as e:
            raise SandboxError(
                f"e2b sandbox {self.session_id}: setup failed (exit {e.exit_code}): {e.stderr.strip()[-300:]}"
            ) from e
        except SandboxException as e:
            raise SandboxError(f"e2b sandbox {self.session_id}: setup failed to run: {e}") from e

    async def read_file(self, path: str) -> bytes:
        """Download a workspace file."""
        from e2b import SandboxException

        self._check()
        try:
            return bytes(await self.sbx.files.read(self._abs(path), format="bytes"))
        except SandboxException as e:
            raise SandboxError(f"cannot read {path!r} in e2b sandbox {self.session_id}: {e}") from e

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Upload a workspace file (envd creates parent directories)."""
        from e2b import SandboxException

        self._check()
        if relative_workspace_path(path, self.workdir) == ".":
            raise SandboxError("cannot write to the workspace root itself: give a file path")
        try:
            await self.sbx.files.write(
                self._abs(path), data.encode() if isinstance(data, str) else bytes(data)
            )
        except SandboxException as e:
            raise SandboxError(f"cannot write {path!r} in e2b sandbox {self.session_id}: {e}") from e

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List a workspace directory (depth 1)."""
        from e2b import FileType, SandboxException

        self._check()
        try:
            entries = await self.sbx.files.list(self._abs(path), depth=1)
        except SandboxException as e:
            raise SandboxError(f"cannot list {path!r} in e2b sandbox {self.session_id}: {e}") from e
        return sorted(
            (
                FileInfo(
                    name=e.name,
                    path=posixpath.relpath(e.path, self.workdir),
                    is_dir=e.type == FileType.DIR,
                    size=e.size,
                )
                for e in entries
            ),
            key=lambda f: f.name,
        )

    async def archive(self) -> bytes:
        """tar.gz the workspace inside the VM, download it, delete it."""
        self._check()
        name = f".dressage-archive-{uuid.uuid4().hex}.tgz"
        tmp = f"/tmp/{name}"
        r = await self.exec(f"tar czf {tmp} --exclude=./{name} . && mv {tmp} ./{name}", timeout=300)
        if r.exit_code != 0:
            raise SandboxError(f"archiving e2b sandbox {self.session_id} failed: {r.stderr.strip()}")
        try:
            return await self.read_file(name)
        finally:
            await self.exec(["rm", "-f", name])

    async def terminate(self) -> None:
        """Kill the VM (everything in it dies). Idempotent."""
        from e2b import SandboxException

        if self._terminated:
            return
        self._terminated = True
        try:
            await self.sbx.kill()
        except SandboxException as e:
            raise SandboxError(f"could not kill e2b sandbox {self.session_id}: {e}") from e


class E2BProvider(SandboxProvider):
    """Creates :class:`E2BSandbox` instances. ``lifetime_s`` is the VM's own auto-kill timeout."""

    name = "e2b"

    def __init__(
        self,
        api_key: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        workdir: str = DEFAULT_WORKDIR,
        lifetime_s: int = 3600,
    ) -> None:
        self.api_key = api_key
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.domain = domain
        self.workdir = workdir
        self.lifetime_s = lifetime_s

    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """The template's VM: ``memory_mb`` / ``max_processes`` are not applied (module docstring)."""
        return LimitsInForce(
            "e2b-template", "the E2B template's VM size; sandbox.memory_mb and max_processes are not applied"
        )

    async def create(self, session_id: str, spec: SandboxSpec) -> E2BSandbox:
        """Create a VM from ``spec.template`` (E2B's default template when None) and seed files."""
        if spec.image:
            raise NotSupportedError(
                "spec.image needs sandbox provider 'image': on E2B a task image is an E2B template (spec.template)"
            )
        if spec.rootfs:
            raise NotSupportedError(
                "spec.rootfs is bubblewrap-only: an E2B VM has its own root filesystem "
                "(a task image is an E2B template, spec.template)"
            )
        if spec.proxy_socket:
            raise NotSupportedError(
                "spec.proxy_socket is bubblewrap-only: an E2B VM cannot reach a host Unix socket; "
                "give the agent a proxy URL reachable from the internet instead"
            )
        sbx = await self.start_vm(session_id, spec, spec.template)
        workdir = mounts_workdir(spec.mounts, self.workdir)
        sb = E2BSandbox(session_id, spec, sbx, workdir, self)
        try:
            setup = link_mounts_command(spec.mounts, workdir)
            if setup is not None:
                await sb.run_as_root(setup)
            for rel, data in spec.files.items():
                await sb.write_file(rel, data)
        except BaseException:
            await sb.terminate()
            raise
        return sb

    def api_opts(self) -> dict[str, Any]:
        """The SDK's connection options: the API key (setting ``e2b_api_key``), request timeout, URLs."""
        settings = load_settings()
        configured = settings.e2b_api_key
        api_key = self.api_key or (configured.get_secret_value() if configured else None)
        if not api_key:
            raise SandboxUnavailableError("E2B_API_KEY is not set: export it or pass api_key to E2BProvider")
        opts: dict[str, Any] = {"api_key": api_key, "request_timeout": settings.e2b_request_timeout_s}
        for k in ("api_url", "sandbox_url", "domain"):
            if getattr(self, k):
                opts[k] = getattr(self, k)
        return opts

    async def start_vm(self, session_id: str, spec: SandboxSpec, template: str | None) -> Any:
        """Start one VM of ``template`` (a template or a snapshot id; E2B's default when None) with the
        spec's environment and network; the SDK's ``AsyncSandbox``."""
        try:
            from e2b import AsyncSandbox, AuthenticationException, SandboxException
        except ImportError as e:
            raise SandboxUnavailableError("the e2b SDK is not installed: pip install 'dressage[e2b]'") from e
        opts = self.api_opts()
        try:
            return await AsyncSandbox.create(
                template=template,
                timeout=self.lifetime_s,
                envs=dict(spec.env),
                allow_internet_access=spec.network,
                metadata={"dressage_session": session_id[:256]},
                **opts,
            )
        except AuthenticationException as e:
            raise SandboxUnavailableError(f"E2B rejected the API key: {e}") from e
        except SandboxException as e:
            raise SandboxError(f"could not create an e2b sandbox for session {session_id}: {e}") from e


def snapshot_id(manifest: Manifest) -> str:
    """The E2B snapshot a checkpoint's manifest names; refuses one of another provider."""
    entry = manifest.by_path().get(SNAPSHOT_ROOT)
    if manifest.roots != (SNAPSHOT_ROOT,) or entry is None or entry.kind != "snapshot" or not entry.target:
        raise CheckpointError(
            f"the checkpoint holds {', '.join(manifest.roots)}, not an E2B snapshot: it cannot be restored on e2b"
        )
    return entry.target


async def delete_checkpoint(provider: E2BProvider, manifest: Manifest) -> bool:
    """Delete the E2B snapshot of a checkpoint (``delete_snapshot``); False when E2B had none."""
    from e2b import AsyncSandbox, SandboxException

    snapshot = snapshot_id(manifest)
    try:
        return bool(await AsyncSandbox.delete_snapshot(snapshot, **provider.api_opts()))
    except SandboxException as e:
        raise SandboxError(f"could not delete e2b snapshot {snapshot}: {e}") from e
