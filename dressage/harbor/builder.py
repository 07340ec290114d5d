"""Which program builds Harbor task images (buildah, Podman or Docker), and its commands.

The ``harbor_builder`` setting (``DRESSAGE_HARBOR_BUILDER``: ``auto``, ``buildah``, ``podman``,
``docker``) picks it; ``auto`` takes Docker where its daemon answers, else Podman where it works, else
buildah (daemonless). buildah and Podman share one private ``vfs`` storage under
``<cache>/harbor-build`` (``--root``/``--runroot``), so an image one of them built (a base made by
``python -m dressage.harbor.build --tag``) is seen by the other; Docker keeps its images in its daemon.
buildah and Podman build with ``--isolation chroot``: a ``RUN`` needs no OCI runtime (which may refuse
a host's cgroups or rlimits until configured) and has the host's network. Whatever the builder, a
built image is copied into an OCI layout that the ``image`` sandbox provider reads (``push --format
oci`` from buildah/Podman; ``skopeo copy docker-daemon:`` from Docker).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dressage.config import environment_values, load_settings
from dressage.errors import ConfigError

BUILDERS = ("buildah", "podman", "docker")
PROBE_TIMEOUT_S = 30.0


def cache_root() -> Path:
    """``<cache_dir>`` (``DRESSAGE_CACHE_DIR``, default ``~/.cache/dressage``)."""
    return Path(load_settings().cache_dir or Path.home() / ".cache" / "dressage")


def storage_args() -> list[str]:
    """buildah's and Podman's private storage: vfs under ``<cache>/harbor-build`` (no system store).

    Its run state (locks, mounts: gone at reboot, as in ``/run``) is in a short folder of the temporary
    directory named by the storage's path: Podman refuses a run root longer than 50 characters."""
    root = cache_root() / "harbor-build"
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    run = Path(tempfile.gettempdir()) / f"dressage-hb-{os.getuid()}-{digest}"
    return ["--root", str(root / "storage"), "--runroot", str(run), "--storage-driver", "vfs"]


@dataclass(frozen=True)
class Builder:
    """One image builder: ``kind`` (``buildah``, ``podman`` or ``docker``) and its executable."""

    kind: str
    exe: str

    def argv(self, *args: str) -> list[str]:
        """The command line of ``args`` (buildah and Podman on the private storage)."""
        return [self.exe, *(storage_args() if self.kind != "docker" else []), *args]

    def run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``args``; never raises for a failing command."""
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, check=False)

    def inspect_args(self, name: str) -> list[str]:
        """Arguments that print the id of image ``name`` (and fail when it is absent)."""
        if self.kind == "buildah":
            return ["inspect", "--type", "image", "--format", "{{.FromImageID}}", name]
        return ["image", "inspect", "--format", "{{.Id}}", name]

    def build_args(self, dockerfile: Path, name: str, context: Path, pull: str) -> list[str]:
        """``build`` of ``dockerfile`` (context ``context``) tagged ``name``; ``pull``: ``never`` (every base
        is local) or ``missing``. RUN steps have the host's network (``pip install`` needs PyPI)."""
        common = ["-f", str(dockerfile), "-t", name, str(context)]
        if self.kind == "docker":  # pulls a missing base itself; --pull would pull every base
            return ["build", "--quiet", *common]
        # chroot isolation: RUN needs no OCI runtime (Podman's runc or crun may refuse this host's
        # cgroups or rlimits until configured) and shares the host's network
        return ["build", "--quiet", "--isolation", "chroot", "--layers=false", f"--pull={pull}", *common]

    def docker_export_argv(self, name: str, target: Path) -> list[str]:
        """The command that copies image ``name`` out of Docker's daemon into the OCI layout ``target``
        (tag ``latest``): ``skopeo copy docker-daemon:`` (buildah and Podman ``push --format oci``)."""
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            raise ConfigError("copying a Docker-built image needs skopeo (apt-get install skopeo)")
        host = environment_values(("DOCKER_HOST",))["DOCKER_HOST"]  # the daemon the docker CLI talks to
        daemon = ["--src-daemon-host", host] if host else []
        return [skopeo, "copy", "--quiet", *daemon, f"docker-daemon:{name}", f"oci:{target}:latest"]


_found: dict[tuple[str, str | None, str | None], Builder] = {}


def _works(kind: str, exe: str) -> bool:
    """Whether ``exe`` answers: Docker's daemon, or Podman on the private storage."""
    try:
        r = subprocess.run(
            Builder(kind, exe).argv("images", "-q"), capture_output=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def find_builder() -> Builder:
    """The builder the ``harbor_builder`` setting names (``auto``: see the module doc), checked to answer
    (buildah: on PATH); cached per process, setting, ``PATH`` and ``DOCKER_HOST``. :class:`ConfigError`
    says what was tried."""
    wanted = load_settings().harbor_builder
    env = environment_values(("PATH", "DOCKER_HOST"))
    key = (wanted, env["PATH"], env["DOCKER_HOST"])
    if key in _found:
        return _found[key]
    tried: list[str] = []
    for kind in BUILDERS[::-1] if wanted == "auto" else (wanted,):
        exe = shutil.which(kind)
        if exe is None:
            tried.append(f"{kind}: not installed")
        elif kind != "buildah" and not _works(kind, exe):
            tried.append(
                f"{kind}: {'its daemon does not answer' if kind == 'docker' else 'does not work here'}"
            )
        else:
            _found[key] = Builder(kind, exe)
            return _found[key]
    raise ConfigError(
        f"building a Harbor task's Dockerfile needs an image builder (harbor_builder: {wanted}; "
        f"{'; '.join(tried)}): apt-get install buildah (scripts/setup-harbor.sh), or podman, or start Docker"
    )
