"""A small OCI test image built offline, in every form the image provider takes (no registry).

The root filesystem is the host's own Debian packages (``dpkg -L``: dash, bash, coreutils, grep,
sed, findutils, libgcc-s1, util-linux's ``unshare``, python3.11 and its standard library) plus the shared libraries their
binaries load (``ldd``), with an ``/etc/passwd`` naming a user ``app`` (uid 1234, gid 2345) and a
file in ``/app``. ``buildah`` commits it (``FROM scratch``) into a private containers-storage (vfs
driver, its own ``--root``/``--runroot``) with ``User app``, ``WorkingDir /app``, an ``Env`` and an
``Entrypoint``/``Cmd``; ``skopeo`` copies it into an OCI layout, an oci-archive and a docker-archive.
About 50 MB; a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGES = (
    "dash",
    "bash",
    "coreutils",
    "grep",
    "sed",
    "findutils",
    "libgcc-s1",  # glibc loads libgcc_s.so.1 at thread exit / cancellation, as in every real base image
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
)
EXTRA = ("/usr/bin/unshare", "/usr/bin/python3")
TOOLS = ("skopeo", "umoci", "buildah")
_SKIP_DOCS = (
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/locale",
    "/usr/share/lintian",
    "/usr/share/info",
)
IMAGE_NAME = "localhost/dressage-test:latest"
OTHER_NAME = "localhost/dressage-test-other:latest"
NO_PYTHON_NAME = "localhost/dressage-test-nopython:latest"
ENV = {"IMAGE_VAR": "from-image", "PATH": "/usr/local/bin:/usr/bin:/bin"}
UID, GID = 1234, 2345


@dataclass(frozen=True)
class BuiltImage:
    """The same image under each kind of reference; ``storage`` is buildah's private storage root."""

    storage: Path
    containers_storage: str
    oci: str
    oci_archive: str
    docker_archive: str
    #: A second image: the first plus one layer (``/other.txt``), so the two share a layer.
    other: str
    #: The same root filesystem without a python3 binary (the proxy forwarder then uses the host's).
    no_python: str

    @property
    def refs(self) -> dict[str, str]:
        """Kind -> reference."""
        return {
            "containers-storage": self.containers_storage,
            "oci": self.oci,
            "oci-archive": self.oci_archive,
            "docker-archive": self.docker_archive,
        }


def missing_tools() -> str | None:
    """Why the test image cannot be built here, or None."""
    gone = [t for t in (*TOOLS, "dpkg", "ldd") if shutil.which(t) is None]
    if gone:
        return f"the image tests need {', '.join(gone)} (scripts/setup-images.sh installs skopeo, umoci, buildah)"
    return None


def _host_files() -> list[str]:
    """The packages' files plus the libraries their executables load."""
    listed = subprocess.run(["dpkg", "-L", *PACKAGES], capture_output=True, text=True, check=True).stdout
    files = {f for f in listed.splitlines() if os.path.isfile(f) and not f.startswith(_SKIP_DOCS)}
    files |= set(EXTRA)
    for f in sorted(files):
        if "/bin/" in f and os.access(f, os.X_OK):
            out = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
            files |= {w for w in out.split() if w.startswith("/") and ".so" in w}
    return sorted(files)


def _copy(path: str, rootfs: Path) -> None:
    """Copy one host file (a link and its target) under ``rootfs`` at its canonical folder."""
    real_dir = os.path.realpath(os.path.dirname(path))
    src = os.path.join(real_dir, os.path.basename(path))
    dst = rootfs / src.lstrip("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(dst):
        shutil.copy2(src, dst, follow_symlinks=False)
    if os.path.islink(src):
        _copy(os.path.realpath(src), rootfs)


def build_rootfs(rootfs: Path) -> None:
    """The root filesystem described in the module docstring."""
    for f in _host_files():
        _copy(f, rootfs)
    for top in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{top}"):
            os.symlink(os.readlink(f"/{top}"), rootfs / top)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc/passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\napp:x:{UID}:{GID}:app:/home/app:/bin/sh\n"
    )
    (rootfs / "etc/group").write_text(f"root:x:0:\napp:x:{GID}:\n")
    (rootfs / "app").mkdir()
    (rootfs / "app/readme.txt").write_text("from the image\n")
    (rootfs / "opt").mkdir()
    (rootfs / "opt/lower.txt").write_text("lower\n")


def build_test_image(base: Path) -> BuiltImage:
    """Build the image under ``base`` and return its references (see the module docstring)."""
    rootfs = base / "rootfs"
    build_rootfs(rootfs)
    storage = base / "storage"
    cs = f"containers-storage:[vfs@{storage}/root+{storage}/run]{IMAGE_NAME}"
    buildah = [
        "buildah",
        "--root",
        f"{storage}/root",
        "--runroot",
        f"{storage}/run",
        "--storage-driver",
        "vfs",
    ]
    ctr = subprocess.run(
        [*buildah, "from", "scratch"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([*buildah, "copy", "--quiet", ctr, str(rootfs), "/"], check=True, capture_output=True)
    config = [
        "--user",
        "app",
        "--workingdir",
        "/app",
        "--entrypoint",
        '["/bin/sh", "-c"]',
        "--cmd",
        "echo hi",
    ]
    for k, v in ENV.items():
        config += ["--env", f"{k}={v}"]
    subprocess.run([*buildah, "config", *config, ctr], check=True, capture_output=True)
    subprocess.run([*buildah, "commit", "--quiet", ctr, IMAGE_NAME], check=True, capture_output=True)
    subprocess.run([*buildah, "rm", ctr], check=True, capture_output=True)
    ctr = subprocess.run(
        [*buildah, "from", IMAGE_NAME], capture_output=True, text=True, check=True
    ).stdout.strip()
    (base / "other.txt").write_text("other\n")
    subprocess.run(
        [*buildah, "copy", "--quiet", ctr, str(base / "other.txt"), "/other.txt"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*buildah, "commit", "--quiet", ctr, OTHER_NAME], check=True, capture_output=True)
    subprocess.run([*buildah, "rm", ctr], check=True, capture_output=True)
    image = BuiltImage(
        storage=storage,
        containers_storage=cs,
        oci=f"oci:{base}/layout:test",
        oci_archive=f"oci-archive:{base}/image.oci.tar",
        docker_archive=f"docker-archive:{base}/image.docker.tar",
        other=cs.replace(IMAGE_NAME, OTHER_NAME),
        no_python=cs.replace(IMAGE_NAME, NO_PYTHON_NAME),
    )
    for ref in (image.oci, image.oci_archive, image.docker_archive):
        target = ref if not ref.startswith("docker-archive:") else f"{ref}:{IMAGE_NAME}"
        subprocess.run(["skopeo", "copy", "--quiet", cs, target], check=True, capture_output=True)
    for py in (rootfs / "usr/bin").glob("python3*"):
        py.unlink()
    ctr = subprocess.run(
        [*buildah, "from", "scratch"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([*buildah, "copy", "--quiet", ctr, str(rootfs), "/"], check=True, capture_output=True)
    subprocess.run([*buildah, "commit", "--quiet", ctr, NO_PYTHON_NAME], check=True, capture_output=True)
    subprocess.run([*buildah, "rm", ctr], check=True, capture_output=True)
    shutil.rmtree(rootfs)
    return image
