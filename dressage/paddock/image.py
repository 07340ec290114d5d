"""The ``image`` provider: the bubblewrap sandbox over an OCI image's root filesystem.

``sandbox: {provider: image, image: REF}`` runs every command of a session as the bwrap provider
does (:mod:`dressage.paddock.bwrap`: the same namespaces, limits, time, disk quota, proxy socket,
workspace and cleanup), with three differences:

- ``/`` is the image's root filesystem (:mod:`dressage.paddock.image_store` fetches and unpacks it
  once per manifest digest) seen through a copy-on-write overlay (bubblewrap's ``--overlay-src
  ROOTFS --overlay UPPER WORK /``). The cached root filesystem is never written: each session's
  writes outside the workspace land in its own upper folder, which counts against ``disk_mb`` and
  goes with the session, so sessions never see each other's writes.
- the image's config holds: commands run as its ``User`` (resolved to a uid/gid through the image's
  own ``/etc/passwd`` and ``/etc/group``, mapped inside the user namespace; root when it names
  none), start from its ``Env`` (under ``spec.env`` and a call's ``env``) with ``HOME`` the user's
  home, and start in its ``WorkingDir``: the workspace is bound there (and at ``/workspace``), seeded
  with what the image holds in that folder, so the image's own files are the agent's files (they go
  into the workspace archive). Without a ``WorkingDir`` (or ``/``) the workspace is ``/workspace``.
  ``Entrypoint`` and ``Cmd`` are on :attr:`ImageSandbox.image` for callers that start them.
- the proxy forwarder (``spec.proxy_socket``) runs with the image's own ``python3``; in an image
  without one, with the host's (:func:`host_python`: read-only under ``/run/dressage/host``, started
  by the host's dynamic loader, so it never loads the image's libraries).

References are resolved once per provider (so every session of a run sees the same digest) and,
when a run asks for its limits (:meth:`ImageProvider.limits_in_force`), before any session starts:
a missing image or an unreachable registry is refused in one line naming the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import posixpath
import shutil
import subprocess
import tempfile
from pathlib import Path

import orjson

from dressage.errors import SandboxError
from dressage.paddock.base import WORKSPACE_MOUNT, ExecRequest, SandboxSpec
from dressage.paddock.bwrap import (
    BwrapProvider,
    BwrapSandbox,
    _Enforcement,
    _Layout,
    _sandbox_python,
    workspace_bytes,
)
from dressage.paddock.checkpoints import Checkpointer, CheckpointError, Manifest, restore
from dressage.paddock.host_uid import become, check_reachable
from dressage.paddock.image_store import ImageStore, UnpackedImage, check_ref
from dressage.paddock.limits import LimitsInForce
from dressage.paddock.local import clean_env
from dressage.store.artifacts import BlobStore

_PYTHONS = ("usr/bin/python3", "usr/local/bin/python3")
#: Where an image without python3 sees the host's python3 for the proxy forwarder (read-only).
HOST_MOUNT = "/run/dressage/host"
#: The checkpoint root of the overlay's upper folder (:meth:`ImageSandbox.checkpoint`).
OVERLAY_ROOT = "image"
#: Where the overlay restorer sees its staged files and the host's python3 (in the tmpfs ``/tmp``,
#: so nothing of them lands in the overlay).
RESTORE_MOUNT = "/tmp/dressage-restore"
RESTORE_HOST_MOUNT = "/tmp/dressage-host"
_RESTORER = Path(__file__).with_name("_overlay_restore.py")
_MOUNTED = ("proc", "dev", "tmp")


class ImageSandbox(BwrapSandbox):
    """A bwrap sandbox whose ``/`` is an image's root filesystem under a per-session overlay."""

    def __init__(
        self,
        session_id: str,
        spec: SandboxSpec,
        bwrap: str,
        root: Path,
        state: Path,
        enforcement: _Enforcement,
        image: UnpackedImage,
        lease: contextlib.ExitStack,
    ) -> None:
        super().__init__(session_id, spec, bwrap, root, state, enforcement)
        self.image = image
        self._lease = lease
        self.uid = image.config.uid
        self.gid = image.config.gid
        self.workdir = image_workdir(image)

    def _root_args(self) -> list[str]:
        """The image's root filesystem as the read-only lower layer of this session's overlay."""
        upper, work = overlay_dirs(self._state)
        a = ["--overlay-src", str(self.image.rootfs), "--overlay", str(upper), str(work), "/"]
        if self.spec.network and os.path.exists("/etc/resolv.conf"):
            a += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        return a

    def _env(self, req: ExecRequest) -> dict[str, str]:
        """The clean base with the user's ``HOME``, the image's ``Env``, ``spec.env``, the call's ``env``."""
        return clean_env(self.image.config.home, {**self.image.config.env, **req.env_over(self.spec.env)})

    def _disk_used(self) -> int:
        """The workspace plus the files of the overlay's upper folder (the session's writes outside the
        workspace; its folders are mostly the mount points bubblewrap makes, so they are not counted)."""
        return workspace_bytes(self.root) + workspace_bytes(overlay_dirs(self._state)[0], folders=False)

    def writable_roots(self) -> dict[str, Path]:
        """The workspace and, as ``image``, the overlay's upper folder (the session's writes anywhere
        else in the image's filesystem, its deletions as whiteouts): see :meth:`checkpoint`."""
        self._check()
        return {"workspace": self.root, OVERLAY_ROOT: overlay_dirs(self._state)[0]}

    async def checkpoint(self, checkpointer: Checkpointer) -> Manifest:
        """The workspace's files plus the overlay's changes over this image (its digest recorded):
        files, folders and links written anywhere, ``deleted`` image paths, ``opaque_dir`` folders."""
        roots = self.writable_roots()
        overlays = {OVERLAY_ROOT: self.image.digest}
        return await asyncio.to_thread(checkpointer.capture, roots, overlays)

    async def restore_checkpoint(self, manifest: Manifest, blobs: BlobStore) -> None:
        """The workspace's files are written host side (as on bwrap); the overlay's changes are applied
        inside this sandbox, through its own overlay, by :mod:`dressage.paddock._overlay_restore` (so
        the kernel makes the whiteouts and opaque folders). Refuses a checkpoint of another image."""
        await asyncio.to_thread(self._restore, manifest, blobs)

    def _restore(self, manifest: Manifest, blobs: BlobStore) -> None:
        self._check()
        restore(manifest.only(("workspace",)), {"workspace": self.root}, blobs)
        self.restored()
        if OVERLAY_ROOT not in manifest.roots:
            return
        top = manifest.by_path().get(OVERLAY_ROOT)
        if top is None or top.kind != "overlay" or top.target != self.image.digest:
            raise CheckpointError(
                f"the checkpoint's overlay lies over image {top.target if top else None}, "
                f"this sandbox runs {self.image.ref} ({self.image.digest})"
            )
        staging = Path(tempfile.mkdtemp(prefix="restore-", dir=self._state))
        try:
            plan = overlay_plan(manifest, blobs, staging)
            if plan:
                self._apply_overlay(staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _apply_overlay(self, staging: Path) -> None:
        """Run the restorer over this sandbox's overlay as its user, with ``staging`` read-only inside."""
        upper, work = overlay_dirs(self._state)
        py, binds = host_python(RESTORE_HOST_MOUNT)
        a = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--uid", str(self.uid), "--gid", str(self.gid), "--die-with-parent", "--new-session"]
        a += [
            "--cap-drop",
            "ALL",
            "--overlay-src",
            str(self.image.rootfs),
            "--overlay",
            str(upper),
            str(work),
        ]
        a += ["/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for src, dest in binds:
            a += ["--ro-bind", src, dest]
        a += ["--ro-bind", str(staging), RESTORE_MOUNT, "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
        a += ["--", *py, "-I", "-S", f"{RESTORE_MOUNT}/restore.py", f"{RESTORE_MOUNT}/plan.json"]
        uid = self._host_uid
        try:
            r = subprocess.run(
                a,
                capture_output=True,
                timeout=self.spec.max_timeout_s,
                check=False,
                preexec_fn=None if uid is None else lambda: become(uid),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CheckpointError(f"restoring the overlay of sandbox {self.session_id} failed: {e}") from e
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip()[-400:]
            raise CheckpointError(f"restoring the overlay of sandbox {self.session_id} failed: {err}")

    def _forwarder_python(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The image's own python3, else the host's, started by the host's loader from ``/run/dressage/host``."""
        rel = image_python(self.image)
        return (["/" + rel], []) if rel else host_python()

    def _released(self) -> None:
        """End the lease: the image may be evicted once no other sandbox uses it."""
        self._lease.close()


def overlay_plan(manifest: Manifest, blobs: BlobStore, staging: Path) -> list[dict[str, object]]:
    """Stage the overlay's part of ``manifest`` in ``staging`` for :mod:`dressage.paddock._overlay_restore`:
    each file's bytes (by sha256), the restorer and ``plan.json`` (its entries with absolute paths
    inside; ``/proc``, ``/dev`` and ``/tmp`` are mounted over in every command, so left out). The plan."""
    plan: list[dict[str, object]] = []
    for e in manifest.entries:
        root, _, rel = e.path.partition("/")
        parts = [p for p in rel.split("/") if p]
        if root != OVERLAY_ROOT or not parts or parts[0] in _MOUNTED:
            continue
        if any(p in (".", "..") for p in parts):
            raise CheckpointError(f"checkpoint path {e.path!r} leaves the image's filesystem")
        step: dict[str, object] = {"path": "/" + "/".join(parts), "kind": e.kind, "mode": e.mode}
        if e.kind == "symlink":
            step["target"] = e.target
        if e.kind == "file":
            uri = manifest.blobs.get(str(e.sha256))
            if uri is None:
                raise CheckpointError(f"checkpoint manifest names no blob for {e.path} ({e.sha256})")
            staged = staging / str(e.sha256)
            if not staged.exists():
                staged.write_bytes(blobs.get(uri))
            step["blob"] = f"{RESTORE_MOUNT}/{e.sha256}"
        plan.append(step)
    shutil.copyfile(_RESTORER, staging / "restore.py")
    (staging / "plan.json").write_bytes(orjson.dumps(plan))
    for p in staging.iterdir():
        p.chmod(0o644)
    staging.chmod(0o755)
    return plan


def overlay_dirs(state: Path) -> tuple[Path, Path]:
    """The overlay's upper and work folders of a sandbox (under its host-side state folder)."""
    return state / "upper", state / "work"


def image_workdir(image: UnpackedImage) -> str:
    """Where the workspace is mounted and commands start: the image's ``WorkingDir``, else ``/workspace``."""
    wd = posixpath.normpath(image.config.working_dir) if image.config.working_dir else "/"
    if not wd.startswith("/") or wd in ("/", "/proc", "/dev", "/tmp", "/run") or wd.startswith("/run/"):
        return WORKSPACE_MOUNT
    return wd


def image_python(image: UnpackedImage) -> str | None:
    """The image's python3 (relative to its root) for the proxy forwarder, or None."""
    for rel in _PYTHONS:
        if os.path.lexists(image.rootfs / rel):
            return rel
    return None


@functools.cache
def host_python(mount: str = HOST_MOUNT) -> tuple[list[str], list[tuple[str, str]]]:
    """The host's python3 for an image without one: its files (and the libraries ``ldd`` lists) bound
    read-only under ``mount`` (``/run/dressage/host``), started by the host's own dynamic loader with
    the host's library folders, so nothing of the image's C library mixes in. Returns the command and
    the binds."""
    py, extra = _sandbox_python()
    py = os.path.realpath(py)
    try:
        out = subprocess.run(["ldd", py], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"cannot list the libraries of {py} for the proxy forwarder (ldd: {e})") from e
    libs = [os.path.realpath(w) for w in out.split() if w.startswith("/")]
    tops = {_top(p, extra) for p in [py, *libs]}
    binds = [(t, mount + t) for t in sorted(tops)]
    loader = next((p for p in libs if os.path.basename(p).startswith("ld-")), None)
    if loader is None:  # a static python
        return [mount + py], binds
    lib_path = ":".join(sorted({mount + os.path.dirname(p) for p in libs}))
    return [
        mount + loader,
        "--library-path",
        lib_path,
        "--argv0",
        mount + py,
        mount + py,
    ], binds


def _top(path: str, prefixes: list[str]) -> str:
    """The folder to bind for ``path``: ``/usr``, the python prefix holding it, else its own folder."""
    for top in ["/usr", *prefixes]:
        if path.startswith(top.rstrip("/") + "/"):
            return top
    return os.path.dirname(path)


class _ImageLayout(_Layout):
    """The image sandbox's folder: the overlay's folders, the workspace seeded from ``WorkingDir``."""

    def __init__(self, image: UnpackedImage, lease: contextlib.ExitStack) -> None:
        self.image = image
        self.lease = lease

    def fill(self, root: Path, state: Path, spec: SandboxSpec) -> None:
        """Make the overlay's folders; copy the image's working directory into the workspace."""
        for d in overlay_dirs(state):
            d.mkdir()
        wd = image_workdir(self.image)
        if wd == WORKSPACE_MOUNT:
            return
        lower = Path(os.path.realpath(self.image.rootfs))
        src = Path(os.path.realpath(lower / wd.lstrip("/")))
        if src != lower and lower not in src.parents:
            raise SandboxError(f"image {self.image.ref}: WorkingDir {wd} resolves outside the image: refused")
        if src.is_dir():
            shutil.copytree(src, root, symlinks=True, dirs_exist_ok=True)

    def check_reachable(self, host_uid: int) -> None:
        """The image's root filesystem must be reachable by the sandbox's own host uid."""
        check_reachable(str(self.image.rootfs), "the image's root filesystem", host_uid)

    def sandbox(
        self,
        session_id: str,
        spec: SandboxSpec,
        bwrap: str,
        root: Path,
        state: Path,
        enforcement: _Enforcement,
    ) -> ImageSandbox:
        """The image sandbox over the filled folder; it ends the lease when it terminates."""
        return ImageSandbox(session_id, spec, bwrap, root, state, enforcement, self.image, self.lease)


class ImageProvider(BwrapProvider):
    """Creates :class:`ImageSandbox` instances of ``spec.image`` (see the module doc).

    ``store``: where images are cached (default: ``<cache_dir>/images`` with the settings' limits).
    """

    name = "image"

    def __init__(
        self, root_dir: str | Path | None = None, bwrap: str | None = None, store: ImageStore | None = None
    ) -> None:
        super().__init__(root_dir=root_dir, bwrap=bwrap)
        self.store = store or ImageStore()
        self._digests: dict[str, str] = {}
        self._resolving: dict[str, asyncio.Lock] = {}

    async def digest(self, ref: str) -> str:
        """The manifest digest of ``ref``, fetched into the store once per provider."""
        ref = check_ref(ref)
        lock = self._resolving.setdefault(ref, asyncio.Lock())
        async with lock:
            if ref not in self._digests:
                self._digests[ref] = await asyncio.to_thread(self.store.resolve, ref)
        return self._digests[ref]

    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """As bwrap's, after fetching ``spec.image`` (a missing image refuses the run before it starts;
        a run whose tasks bring their own images names none here)."""
        if spec.image:
            await self.digest(_image_of(spec))
        return await super().limits_in_force(spec)

    async def create(self, session_id: str, spec: SandboxSpec) -> BwrapSandbox:
        """Lease the image (unpacked once), then build the bwrap sandbox over its overlay. A spec
        naming no image (a Harbor task without one: image-less, or an apt-only root filesystem in
        ``spec.rootfs``) is a plain bwrap sandbox, as on provider ``bwrap``."""
        if not spec.image:
            return await self._create(session_id, spec, _Layout())
        ref = _image_of(spec)
        digest = await self.digest(ref)
        lease = contextlib.ExitStack()
        try:
            image = await asyncio.to_thread(lease.enter_context, self.store.lease(ref, digest))
            sb = await self._create(session_id, spec, _ImageLayout(image, lease))
        except BaseException:
            lease.close()
            raise
        assert isinstance(sb, ImageSandbox)
        return sb


def _image_of(spec: SandboxSpec) -> str:
    """``spec.image``, refused in one line when absent or combined with ``spec.rootfs``."""
    if not spec.image:
        raise SandboxError(
            "sandbox provider 'image' needs sandbox.image: an image reference such as docker://HOST/NAME:TAG, "
            "oci:DIR[:TAG], oci-archive:TAR, docker-archive:TAR, containers-storage:NAME or docker-daemon:NAME:TAG"
        )
    if spec.rootfs:
        raise SandboxError("sandbox.image and spec.rootfs both name a root filesystem: give one")
    return spec.image
