"""OCI images as cached root filesystems: fetch with skopeo, unpack with umoci, share, evict.

The image sandbox provider (:mod:`dressage.paddock.image`) runs a session over an image's root
filesystem. This module gets that root filesystem; it never reads a layer itself (layers, whiteouts
and ownership are the business of the maintained tools):

- **fetch**: ``skopeo copy REF oci:<cache>/images/oci:<tag>`` copies any image reference into one
  OCI image layout shared by every image, so a layer two images have in common is stored once
  (skopeo skips blobs the layout has). The manifest's digest in that layout names the image.
- **unpack**: ``umoci unpack --rootless`` turns the manifest into a bundle
  ``<cache>/images/rootfs/<digest>/`` (``rootfs/`` plus umoci's runtime ``config.json``, in which the
  image's ``User`` is already resolved to a uid/gid through the image's own ``/etc/passwd``), once:
  a file lock per digest lets one worker unpack while the others wait, and the bundle appears by an
  atomic rename, so nobody ever sees half of one.
- **lease**: every live sandbox holds a shared lock on its image's ``<digest>.use`` file; eviction
  takes that lock exclusively without waiting, so an image in use is never evicted. A crashed
  worker's locks go with its process.
- **evict**: after an unpack, bundles least recently leased go (with their manifest's blobs, through
  ``umoci rm`` + ``umoci gc``) until the cache holds at most ``image_cache_mb`` (a setting).

References (``REF``): ``docker://HOST/NAME:TAG`` (a registry), ``oci:DIR[:TAG]`` (an OCI layout
directory), ``oci-archive:TAR[:TAG]``, ``docker-archive:TAR[:NAME:TAG]`` and
``containers-storage:[DRIVER@ROOT+RUNROOT]NAME`` (an image buildah or podman built; the bracket names
a private storage root, e.g. ``containers-storage:[vfs@/tmp/st+/tmp/run]localhost/task:latest``),
``docker-daemon:NAME:TAG`` (an image in Docker's own storage: the daemon at ``DOCKER_HOST``, else
Docker's default socket). This is skopeo's own syntax (``man containers-transports``); other transports are refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dressage.config import environment_values, load_settings
from dressage.errors import SandboxError, SandboxUnavailableError
from dressage.paddock.bwrap import workspace_bytes

#: The transports a ``REF`` may use (skopeo's names).
TRANSPORTS = ("docker://", "oci:", "oci-archive:", "docker-archive:", "containers-storage:", "docker-daemon:")
_TOOLS = {
    "skopeo": "apt-get install skopeo",
    "umoci": "apt-get install umoci",
}


class ImageConfig(BaseModel):
    """What a sandbox takes from an image's config (OCI ``config`` section plus umoci's resolution).

    ``uid``/``gid``: the image's ``User`` resolved through its own ``/etc/passwd`` and ``/etc/group``
    (0/0 when it names none); ``home``: that user's home directory. ``entrypoint``/``cmd``: as the
    image declares them, for callers that start the image's own program.
    """

    model_config = ConfigDict(frozen=True)

    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str = ""
    user: str = ""
    uid: int = 0
    gid: int = 0
    home: str = "/"
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


class UnpackedImage(BaseModel):
    """One image's cached bundle: ``rootfs`` (read-only lower layer of every session) and its config."""

    model_config = ConfigDict(frozen=True)

    ref: str
    digest: str
    rootfs: Path
    config: ImageConfig


def check_ref(ref: str) -> str:
    """Refuse (one line) a ``REF`` that names no transport this store handles; returns it stripped."""
    ref = ref.strip() if isinstance(ref, str) else ""
    if not ref or not ref.startswith(TRANSPORTS) or ref in TRANSPORTS:
        raise SandboxError(
            f"sandbox.image {ref!r} is not an image reference: give one of docker://HOST/NAME:TAG, oci:DIR[:TAG], "
            "oci-archive:TAR, docker-archive:TAR, containers-storage:[DRIVER@ROOT+RUNROOT]NAME, docker-daemon:NAME:TAG"
        )
    return ref


def _source_options(ref: str) -> list[str]:
    """skopeo's options for reading ``ref``: a ``docker-daemon:`` image comes from the daemon the
    ``docker`` client talks to (``DOCKER_HOST`` where set, else Docker's default socket)."""
    if not ref.startswith("docker-daemon:"):
        return []
    host = environment_values(("DOCKER_HOST",))["DOCKER_HOST"]
    return ["--src-daemon-host", host] if host else []


def image_cache_dir() -> Path:
    """``<cache_dir>/images`` (``DRESSAGE_CACHE_DIR``, default ``~/.cache/dressage``)."""
    base = load_settings().cache_dir or Path.home() / ".cache" / "dressage"
    return Path(base) / "images"


def require_tools() -> None:
    """Refuse (one line) where skopeo or umoci is missing; ``scripts/setup-images.sh`` installs them."""
    for tool, how in _TOOLS.items():
        if shutil.which(tool) is None:
            raise SandboxUnavailableError(
                f"the image sandbox needs {tool}, which is not on PATH: {how} (scripts/setup-images.sh)"
            )


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    """Hold ``flock(mode)`` on ``path`` (created) for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


class ImageStore:
    """The shared OCI layout and the unpacked bundles under ``root`` (default :func:`image_cache_dir`).

    ``max_mb``: the cache's size limit (default: the ``image_cache_mb`` setting); ``timeout_s``: how
    long one skopeo or umoci run may take (default: the ``image_pull_timeout_s`` setting).
    """

    def __init__(
        self, root: Path | None = None, max_mb: int | None = None, timeout_s: float | None = None
    ) -> None:
        settings = load_settings()
        self.root = Path(root) if root else image_cache_dir()
        self.max_bytes = (settings.image_cache_mb if max_mb is None else max_mb) * 1024 * 1024
        self.timeout_s = settings.image_pull_timeout_s if timeout_s is None else timeout_s
        self.layout = self.root / "oci"
        self.bundles = self.root / "rootfs"
        #: How many images this store object unpacked (the others it leased were cached).
        self.unpacks = 0

    # --- fetch -----------------------------------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        """Copy ``ref`` into the shared layout and return its manifest digest (``sha256:...``)."""
        ref = check_ref(ref)
        require_tools()
        self.bundles.mkdir(parents=True, exist_ok=True)
        tag = "r-" + hashlib.sha256(ref.encode()).hexdigest()[:40]
        with _flock(self.root / "oci.lock", fcntl.LOCK_EX):
            self._run(
                ["skopeo", "copy", "--quiet", *_source_options(ref), ref, f"oci:{self.layout}:{tag}"],
                ref,
                "fetch",
            )
            digest = self._tagged(tag)
            name = _digest_tag(digest)
            if name not in self._tags():
                self._run(["umoci", "tag", "--image", f"{self.layout}:{tag}", name], ref, "tag")
            self._run(["umoci", "rm", "--image", f"{self.layout}:{tag}"], ref, "untag")
        use = self.bundles / f"{_hex(digest)}.use"
        use.touch()  # an image fetched but never leased is a candidate for eviction too
        return digest

    def _tags(self) -> dict[str, str]:
        """Tag -> manifest digest of the shared layout (its ``index.json``)."""
        try:
            index = json.loads((self.layout / "index.json").read_text())
        except (OSError, ValueError):
            return {}
        out = {}
        for m in index.get("manifests") or []:
            name = (m.get("annotations") or {}).get("org.opencontainers.image.ref.name")
            if name:
                out[name] = m["digest"]
        return out

    def _tagged(self, tag: str) -> str:
        digest = self._tags().get(tag)
        if digest is None:
            raise SandboxError(f"skopeo wrote no manifest for tag {tag} into {self.layout}")
        return digest

    def _run(self, argv: list[str], ref: str, what: str) -> str:
        """Run a tool; its failure becomes one line naming the image and the tool's last message."""
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise SandboxError(
                f"image {ref}: {argv[0]} {what} took over {self.timeout_s:.0f} s (image_pull_timeout_s)"
            ) from None
        if r.returncode != 0:
            lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
            last = _message(lines[-1]) if lines else f"exit status {r.returncode}"
            raise SandboxError(f"image {ref}: {argv[0]} cannot {what} it: {last}")
        return r.stdout

    # --- unpack and lease --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, ref: str, digest: str) -> Iterator[UnpackedImage]:
        """The bundle of ``digest`` (unpacked first if absent), kept from eviction for the block."""
        use = self.bundles / f"{_hex(digest)}.use"
        fd = os.open(use, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.utime(use)  # least recently leased goes first
            image, fresh = self._unpacked(ref, digest)
            if fresh:
                self.evict()
            yield image
        finally:
            os.close(fd)

    def _unpacked(self, ref: str, digest: str) -> tuple[UnpackedImage, bool]:
        """Unpack ``digest`` once (other workers wait on its lock); True when this call unpacked it."""
        bundle = self.bundles / _hex(digest)
        fresh = False
        if not (bundle / "image.json").exists():
            with _flock(self.bundles / f"{_hex(digest)}.unpack", fcntl.LOCK_EX):
                if not (bundle / "image.json").exists():
                    if _digest_tag(digest) not in self._tags() and self.resolve(ref) != digest:
                        raise SandboxError(
                            f"image {ref} changed while in use (was {digest}): restart the run"
                        )
                    self._unpack(ref, digest, bundle)
                    self.unpacks += 1
                    fresh = True
        config = ImageConfig.model_validate_json((bundle / "image.json").read_text())
        return UnpackedImage(ref=ref, digest=digest, rootfs=bundle / "rootfs", config=config), fresh

    def _unpack(self, ref: str, digest: str, bundle: Path) -> None:
        """umoci unpack into a temporary folder, record the config, rename into place."""
        tmp = self.bundles / f".{_hex(digest)}.{uuid.uuid4().hex[:8]}"
        try:
            with _flock(self.root / "oci.lock", fcntl.LOCK_SH):
                image = f"{self.layout}:{_digest_tag(digest)}"
                self._run(["umoci", "unpack", "--rootless", "--image", image, str(tmp)], ref, "unpack")
                raw = self._run(["skopeo", "inspect", "--config", f"oci:{image}"], ref, "inspect")
            config = _image_config(json.loads(raw), json.loads((tmp / "config.json").read_text()))
            (tmp / "image.json").write_text(config.model_dump_json())
            os.chmod(tmp, 0o755)  # umoci makes it 0700: a sandbox under its own host uid must reach rootfs/
            shutil.rmtree(bundle, ignore_errors=True)  # a half-evicted leftover
            os.rename(tmp, bundle)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # --- eviction ------------------------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes the cache holds (bundles and the shared layout), as ``du`` counts them."""
        return workspace_bytes(self.root)

    def evict(self) -> list[str]:
        """Remove least recently leased bundles not in use until the cache fits ``max_bytes``.

        Returns the digests evicted. A bundle in use (another lease's shared lock) is skipped."""
        self._sweep()
        evicted: list[str] = []
        uses = sorted(self.bundles.glob("*.use"), key=lambda p: p.stat().st_mtime)
        for use in uses:
            if self.usage() <= self.max_bytes:
                break
            fd = os.open(use, os.O_RDWR)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # in use
                dropped = self._drop(use.name.removesuffix(".use"))
                if dropped:
                    evicted.append(dropped)
            finally:
                os.close(fd)
        return evicted

    def _sweep(self) -> None:
        """Remove what a crashed process left half done (``.<digest>.*`` folders of an unpack or an
        eviction) where nobody holds that digest's unpack lock now."""
        for leftover in self.bundles.glob(".*"):
            lock = self.bundles / f"{leftover.name[1:].split('.')[0]}.unpack"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # an unpack of that digest is under way
            else:
                shutil.rmtree(leftover, ignore_errors=True)
            finally:
                os.close(fd)

    def _drop(self, hex_digest: str) -> str | None:
        """Delete one bundle and its manifest (and blobs no other manifest uses); None when neither
        was there (evicted before)."""
        bundle = self.bundles / hex_digest
        gone = self.bundles / f".{hex_digest}.evicted.{uuid.uuid4().hex[:8]}"
        found = False
        with contextlib.suppress(FileNotFoundError):
            os.rename(bundle, gone)  # atomic: no lease sees half a bundle
            found = True
        shutil.rmtree(gone, ignore_errors=True)
        digest = f"sha256:{hex_digest}"
        with _flock(self.root / "oci.lock", fcntl.LOCK_EX):
            if _digest_tag(digest) in self._tags():
                found = True
                image = f"{self.layout}:{_digest_tag(digest)}"
                self._run(["umoci", "rm", "--image", image], digest, "remove")
                self._run(["umoci", "gc", "--layout", str(self.layout)], digest, "collect")
        return digest if found else None


def _message(line: str) -> str:
    """The message of a tool's log line (skopeo: ``time=... level=fatal msg="..."``), else the line."""
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', line)
    return m.group(1).replace('\\"', '"') if m else line


def _hex(digest: str) -> str:
    algo, _, value = digest.partition(":")
    if algo != "sha256" or len(value) != 64:
        raise SandboxError(f"unexpected manifest digest {digest!r}")
    return value


def _digest_tag(digest: str) -> str:
    return "d-" + _hex(digest)


def _image_config(image: dict[str, Any], runtime: dict[str, Any]) -> ImageConfig:
    """The image's own config (``skopeo inspect --config``) plus umoci's resolved user and home."""
    cfg = image.get("config") or {}
    process = runtime.get("process") or {}
    user = process.get("user") or {}
    resolved = dict(str(e).partition("=")[::2] for e in process.get("env") or [])
    env = dict(str(e).partition("=")[::2] for e in cfg.get("Env") or [])
    return ImageConfig(
        env=env,
        working_dir=str(cfg.get("WorkingDir") or ""),
        user=str(cfg.get("User") or ""),
        uid=int(user.get("uid", 0)),
        gid=int(user.get("gid", 0)),
        home=str(resolved.get("HOME") or "/"),
        entrypoint=tuple(cfg.get("Entrypoint") or ()),
        cmd=tuple(cfg.get("Cmd") or ()),
    )
