"""Any Harbor task Dockerfile built into an OCI image with the machine's builder (buildah, Podman, Docker).

A Dockerfile that is not apt-only (pip or curl in ``RUN``, ``USER``, ``ADD``, multi-stage builds,
...) is built as written by the builder :mod:`dressage.harbor.builder` picks (the ``harbor_builder``
setting; ``auto``: Docker where its daemon answers, else Podman, else buildah: daemonless,
``--isolation chroot``, ``vfs`` storage in a private ``--root``/``--runroot`` under the cache, which
Podman shares), then copied into an OCI layout directory ``<cache>/harbor-images/<key>/`` that the
``image`` sandbox provider runs (``oci:DIR``; :mod:`dressage.paddock.image`). ``key`` is the sha256 of
the Dockerfile and every file of the task's ``environment/`` (its build context): a Dockerfile's
content is built once, however many tasks, episodes or workers use it (a file lock per key:
concurrent workers wait for the one that builds), whichever builder built it.
The build's log is kept next to the image (``<key>.log``, redacted) and stored as an artifact of
every session of its tasks; a failed build is remembered (``<key>.failed``) so it fails its tasks
with the build's error, never the whole run (delete that file to try again).

Bases (every ``FROM``): an earlier stage or ``scratch`` need nothing. ``debian:<tag>`` and
``ubuntu:<tag>`` are made from the distribution's own packages (``mmdebstrap --variant=minbase``, the
variant their official images are, from ``deb.debian.org`` or ``archive.ubuntu.com``:
:mod:`dressage.harbor.distro`), with this machine's CA bundle added (its package registries are
reached through it), and tagged ``docker.io/library/<distro>:<tag>`` in the builder's storage, so such
tasks need no registry; where that archive cannot be reached (and the base is not made yet) the task
is refused before any agent runs. Any other base must be an image of the builder's storage (built
there by ``python -m dressage.harbor.build --tag NAME DIR``, as the tests do) or be reachable in its
registry; otherwise the task is refused before any agent runs, naming the task, the Dockerfile line
and the image. A task's prebuilt ``docker_image`` is looked up the same way (builder's storage, else
its registry).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dressage.errors import ConfigError, SandboxError
from dressage.harbor.builder import cache_root, find_builder
from dressage.harbor.distro import (
    DISTRO_TAGS,
    distro_of,
    mmdebstrap_args,
    require_archive,
    suite_of,
)
from dressage.harbor.dockerfile import logical_lines
from dressage.redact import redact, redacted_tail

_FROM = re.compile(r"^(?:--platform=\S+\s+)?(\S+)(?:\s+[Aa][Ss]\s+(\S+))?$")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_CA_COPY = "/usr/local/share/ca-certificates/host-bundle.crt"
REGISTRY_TIMEOUT_S = 20.0
ERROR_CHARS = 1500


def images_dir() -> Path:
    """Where built images (OCI layouts), their logs and failure marks are: ``<cache>/harbor-images``."""
    return cache_root() / "harbor-images"


def _builder(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return find_builder().run(*args, timeout=timeout)


@dataclass(frozen=True)
class Base:
    """One ``FROM`` of a Dockerfile: its line, image and where that image comes from."""

    lineno: int
    image: str
    source: str
    """``stage``, ``scratch``, ``debian:<release>``/``ubuntu:<release>`` (made from the distribution's
    packages), ``local`` (the builder's storage) or ``registry``."""


def local_image(name: str) -> bool:
    """Whether ``name`` is an image of the builder's storage."""
    return image_id(name) is not None


def registry_reachable(image: str) -> bool:
    """Whether ``image`` can be read from its registry (``skopeo inspect``, a short timeout)."""
    exe = shutil.which("skopeo")
    if exe is None:
        return False
    ref = image if "://" in image else f"docker://{image}"
    try:
        r = subprocess.run([exe, "inspect", "--raw", ref], capture_output=True, timeout=REGISTRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def _source(where: str, image: str, stages: set[str]) -> str:
    """Where the base ``image`` of a ``FROM`` comes from (see :attr:`Base.source`), or
    :class:`ConfigError` naming ``where`` and the image when it cannot be had here."""
    distro = distro_of(image)
    tag = image.partition(":")[2] or "latest"
    if image.lower() in stages:
        return "stage"
    if image == "scratch":
        return "scratch"
    if distro is not None and tag in DISTRO_TAGS[distro]:
        suite = DISTRO_TAGS[distro][tag]
        if not local_image(f"docker.io/library/{distro}:{tag}"):
            require_archive(where, image, distro, suite)
        return f"{distro}:{suite}"
    if local_image(image):
        return "local"
    if registry_reachable(image):
        return "registry"
    if distro is not None:
        suite_of(where, image)  # raises: names the tag and the tags made here
    raise ConfigError(
        f"{where}: base image {image!r} is not built here and no registry serving it is reachable: build it "
        "into the task image storage (python -m dressage.harbor.build --tag NAME DIR) or use FROM debian:<tag> "
        "or ubuntu:<tag>"
    )


def bases(task: str, text: str) -> list[Base]:
    """Every ``FROM`` of ``text`` and its source, or :class:`ConfigError` naming the task, the line and
    an image that cannot be had: a Debian or Ubuntu base whose archive does not answer, or another
    base neither in the builder's storage nor reachable in a registry."""
    out: list[Base] = []
    stages: set[str] = set()
    for lineno, line in logical_lines(text):
        instr, _, rest = line.partition(" ")
        if instr.upper() != "FROM":
            continue
        m = _FROM.match(rest.strip())
        if not m:
            raise ConfigError(f"task {task}: Dockerfile line {lineno}: cannot read FROM {rest.strip()!r}")
        image, stage = m.group(1), m.group(2)
        if "$" in image:
            raise ConfigError(
                f"task {task}: Dockerfile line {lineno}: base image {image!r} uses a build argument: refused "
                "(the base must be known before the build to be checked and cached)"
            )
        out.append(Base(lineno, image, _source(f"task {task}: Dockerfile line {lineno}", image, stages)))
        if stage:
            stages.add(stage.lower())
    if not out:
        raise ConfigError(f"task {task}: Dockerfile has no FROM")
    return out


def image_id(name: str) -> str | None:
    """The id of image ``name`` in the builder's storage (None when it is not there)."""
    r = _builder(*find_builder().inspect_args(name))
    return (r.stdout.strip().removeprefix("sha256:") or None) if r.returncode == 0 else None


def build_key(text: str, env_dir: Path, base_ids: tuple[str, ...] = ()) -> str:
    """sha256 of the Dockerfile, every file of the build context (relative path and bytes) and the ids
    of its bases from the builder's storage (a rebuilt base rebuilds the task image)."""
    h = hashlib.sha256(b"dressage-harbor-build-1\0" + text.encode() + "\0".join(base_ids).encode())
    for f in sorted(p for p in env_dir.rglob("*") if p.is_file()):
        h.update(f.relative_to(env_dir).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (across processes and threads: one builder per key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def distro_base(distro: str, tag: str, suite: str, log: list[str]) -> None:
    """``docker.io/library/<distro>:<tag>`` in the builder's storage, made once per tag: ``mmdebstrap
    --variant=minbase`` from the distribution's archive, then built ``FROM scratch`` with that tree,
    this machine's CA bundle and the official images' ``PATH`` and ``CMD``."""
    name = f"docker.io/library/{distro}:{tag}"
    with _locked(images_dir() / f"{distro}-{tag}.lock"):
        if local_image(name):
            return
        exe = shutil.which("mmdebstrap")
        if exe is None:
            raise ConfigError("mmdebstrap is not installed (apt-get install mmdebstrap)")
        with tempfile.TemporaryDirectory(prefix=f"{distro}-", dir=images_dir()) as work:
            ctx = Path(work)
            args = mmdebstrap_args(distro, suite)
            cmd = [exe, "--quiet", "--variant=minbase", "--format=tar"]
            cmd += [str(ctx / "root.tar") if a == "{target}" else a for a in args]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            log.append(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
            if r.returncode != 0:
                raise SandboxError(f"mmdebstrap {suite} failed: {redacted_tail(r.stderr, ERROR_CHARS)}")
            lines = ["FROM scratch", "ADD root.tar /"]
            if HOST_CA_BUNDLE.is_file():  # this machine reaches package registries through it
                shutil.copyfile(HOST_CA_BUNDLE, ctx / "host-ca.crt")
                lines += [f"COPY host-ca.crt {HOST_CA_BUNDLE}", f"COPY host-ca.crt {HOST_CA_COPY}"]
            lines += ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["bash"]']
            (ctx / "Dockerfile").write_text("\n".join(lines) + "\n", encoding="utf-8")
            _checked(log, *find_builder().build_args(ctx / "Dockerfile", name, ctx, "never"))


def _make_bases(found: list[Base], log: list[str]) -> None:
    """Make the Debian and Ubuntu bases of ``found`` that the builder's storage lacks."""
    for base in found:
        distro, _, suite = base.source.partition(":")
        if distro in DISTRO_TAGS:
            distro_base(distro, base.image.partition(":")[2] or "latest", suite, log)


def _logged(log: list[str], argv: list[str], shown: str) -> str:
    """Run ``argv``, log it as ``$ shown``, :class:`SandboxError` with its output when it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    log.append(f"$ {shown}\n{r.stdout}{r.stderr}")
    if r.returncode != 0:
        what = " ".join(shown.split()[:2])
        raise SandboxError(f"{what} failed: {redacted_tail(r.stderr or r.stdout, ERROR_CHARS)}")
    return r.stdout


def _checked(log: list[str], *args: str) -> str:
    """Run the builder with ``args`` (see :func:`_logged`)."""
    found = find_builder()
    return _logged(log, found.argv(*args), f"{found.kind} {' '.join(args)}")


@dataclass(frozen=True)
class Built:
    """A task image: its ``oci:`` reference (None when the build failed), log file and error."""

    key: str | None
    """The build's cache key (None for a prebuilt ``docker_image``)."""
    ref: str | None
    log: str | None
    error: str | None = None


def _push(log: list[str], name: str, target: Path) -> str:
    """Copy ``name`` from the builder's storage into the OCI layout ``target`` (atomically); its ``oci:`` ref."""
    if not (target / "index.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=".push-", dir=target.parent))
        try:
            if find_builder().kind == "docker":  # out of the daemon with skopeo
                argv = find_builder().docker_export_argv(name, tmp)
                _logged(log, argv, " ".join(["skopeo", *argv[1:]]))
            else:
                _checked(log, "push", "--quiet", "--format", "oci", name, f"oci:{tmp}:latest")
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return f"oci:{target}:latest"


def build(
    task: str, text: str, env_dir: Path, dockerfile: str = "Dockerfile", secrets: tuple[str, ...] = ()
) -> Built:
    """Build the Dockerfile ``text`` (context ``env_dir``) once per content; see the module docstring.

    Unknown bases raise :class:`ConfigError` (the run is refused); a failing build returns a
    :class:`Built` with its (redacted) error, which fails the task's sessions."""
    found = bases(task, text)
    key = build_key(
        f"{dockerfile}\0{text}",
        env_dir,
        tuple(image_id(b.image) or b.image for b in found if b.source == "local"),
    )
    out = images_dir()
    out.mkdir(parents=True, exist_ok=True)
    target, log_file, failed = out / key, out / f"{key}.log", out / f"{key}.failed"
    with _locked(out / f"{key}.lock"):
        if (target / "index.json").is_file():
            return Built(key, f"oci:{target}:latest", str(log_file))
        if failed.is_file():
            return Built(key, None, str(log_file), failed.read_text(encoding="utf-8"))
        log: list[str] = [f"task {task}: building {env_dir}/Dockerfile (key {key})\n"]
        try:
            _make_bases(found, log)
            pull = "missing" if any(b.source == "registry" for b in found) else "never"
            name = f"localhost/dressage-harbor/{key}:latest"
            _checked(log, *find_builder().build_args(env_dir / dockerfile, name, env_dir, pull))
            ref = _push(log, name, target)
            _builder("rmi", name)
            return Built(key, ref, str(log_file))
        except SandboxError as e:
            error = redact(f"task {task}: building its Dockerfile failed: {e}", secrets) or ""
            failed.write_text(error, encoding="utf-8")
            return Built(key, None, str(log_file), error)
        finally:
            log_file.write_text(redact("\n".join(log), secrets) or "", encoding="utf-8")


def image_workdir(ref: str) -> str | None:
    """The ``WorkingDir`` of image ``ref`` (``skopeo inspect --config``), None when it sets none."""
    exe = shutil.which("skopeo")
    if exe is None:
        raise ConfigError("reading a task image's config needs skopeo (apt-get install skopeo)")
    r = subprocess.run([exe, "inspect", "--config", ref], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SandboxError(f"cannot read the config of image {ref}: {redacted_tail(r.stderr, 300)}")
    workdir = (json.loads(r.stdout).get("config") or {}).get("WorkingDir") or ""
    return workdir if workdir.startswith("/") and workdir != "/" else None


def prebuilt(task: str, image: str) -> str:
    """The image reference of a task's ``docker_image``: from the builder's storage (copied into an OCI
    layout once per image id), else its registry; else :class:`ConfigError` naming task and image."""
    found = image_id(image)
    if found is not None:
        out = images_dir()
        out.mkdir(parents=True, exist_ok=True)
        with _locked(out / f"id-{found[:32]}.lock"):
            return _push([], image, out / f"id-{found[:32]}")
    if registry_reachable(image):
        return image if "://" in image else f"docker://{image}"
    raise ConfigError(
        f"task {task}: environment.docker_image {image!r} is not built here and no registry serving it is "
        "reachable: build it into the task image storage (python -m dressage.harbor.build --tag NAME DIR)"
    )


def build_tagged(name: str, context: Path) -> bool:
    """Build ``context/Dockerfile`` into the builder's storage as ``name`` (a base or ``docker_image``
    of tasks), unless ``name`` is there already from the same Dockerfile and context; True when built."""
    text = (context / "Dockerfile").read_text(encoding="utf-8")
    found = bases(name, text)
    key = build_key(text, context, tuple(image_id(b.image) or b.image for b in found if b.source == "local"))
    out = images_dir()
    out.mkdir(parents=True, exist_ok=True)
    marker = out / f"tag-{hashlib.sha256(name.encode()).hexdigest()[:16]}.key"
    with _locked(out / f"{marker.name}.lock"):
        current = image_id(name)
        if current is not None and marker.is_file() and marker.read_text() == f"{key} {current}":
            return False
        log: list[str] = []
        _make_bases(found, log)
        _checked(log, *find_builder().build_args(context / "Dockerfile", name, context, "never"))
        marker.write_text(f"{key} {image_id(name)}")
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m dressage.harbor.build --tag NAME DIR``: build ``DIR/Dockerfile`` into the private
    storage as ``NAME`` (a base or ``docker_image`` for tasks; cached by Dockerfile and context). A
    dataset's task images are built ahead by :mod:`dressage.harbor.prebuild`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "--tag":
        print("usage: python -m dressage.harbor.build --tag NAME DIR", file=sys.stderr)
        return 2
    built = build_tagged(args[1], Path(args[2]))
    print(f"{args[1]}: {'built' if built else 'cached (same Dockerfile and context)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
