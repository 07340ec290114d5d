"""A small image for the ``docker`` provider's tests, made from this host's own files (no registry).

CI machines reach package registries only, never an image registry, so the tests' image is imported
(``<engine> import``) from a root filesystem of this host's ``sh``, coreutils and ``python3`` (with its
standard library, for the proxy forwarder) and the libraries they load. Its tag is a hash of what went
in, so it is built once per machine and again only when those files change.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import sysconfig
import tarfile
from pathlib import Path

from dressage.errors import SandboxUnavailableError

BINARIES = (
    "sh", "dash", "cat", "ls", "echo", "printf", "tr", "head", "wc", "sleep", "env", "true", "id",
    "rm", "mkdir", "touch", "stat", "ps", "python3",
)  # fmt: skip
"""What the contract tests and the provider run inside (``ps`` where the host has it)."""
_SKIP_STDLIB = {
    "test",
    "idlelib",
    "tkinter",
    "ensurepip",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
}


def _files() -> dict[str, Path]:
    """In-image path -> host file: the binaries, the libraries ``ldd`` lists for them and the stdlib."""
    files: dict[str, Path] = {}
    for name in BINARIES:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found:
            files[f"usr/bin/{name}"] = Path(os.path.realpath(found))
    stdlib = Path(
        sysconfig.get_paths(scheme="posix_prefix", vars={"base": "/usr", "installed_base": "/usr"})["stdlib"]
    )
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib)
        if path.is_file() and not _SKIP_STDLIB & set(rel.parts):
            files[f"usr/lib/{stdlib.name}/{rel}"] = path
    elfs = [p for p in files.values() if p.suffix == ".so" or p.parent.name == "bin"]
    out = subprocess.run(["ldd", *map(str, elfs)], capture_output=True, text=True, check=False).stdout
    for token in out.split():
        if token.startswith("/") and os.path.exists(token):
            files[token.lstrip("/")] = Path(os.path.realpath(token))
    return files


def _tar(files: dict[str, Path]) -> bytes:
    """The root filesystem as an uncompressed tar (``/bin`` a link to ``/usr/bin``; libraries where
    ``ldd`` found them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/bin")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for d in ("tmp", "workspace", "etc", "root", "run", "dev/shm"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, host in sorted(files.items()):
            tar.add(str(host), arcname=name)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return buf.getvalue()


@functools.cache
def engine_test_image(cli: str, user: str | None = None) -> str:
    """The reference of the tests' image in the engine ``cli``, imported unless it is there already;
    ``user``: the image's configured user (``USER``), none (root) by default."""
    files = _files()
    digest = hashlib.sha256()
    for name, host in sorted(files.items()):
        st = host.stat()
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if user:
        digest.update(f"user {user}".encode())
    ref = f"localhost/dressage-test-sandbox:{digest.hexdigest()[:16]}"
    if subprocess.run([cli, "image", "inspect", ref], capture_output=True, check=False).returncode == 0:
        return ref
    change = ["--change", f"USER {user}"] if user else []
    r = subprocess.run(
        [cli, "import", *change, "-", ref], input=_tar(files), capture_output=True, check=False
    )
    if r.returncode != 0:
        raise SandboxUnavailableError(f"{cli} import of the tests' image failed: {r.stderr.decode().strip()}")
    return ref
