"""A Harbor task's ``environment/Dockerfile`` read as a plan for a Debian root filesystem, or refused.

Only a strict whitelist becomes a root filesystem (built by :mod:`dressage.harbor.rootfs` with
``mmdebstrap`` from Debian packages, no container runtime):

- ``FROM debian:<tag>`` for a tag of :data:`DEBIAN_TAGS` (the plan records the Debian release the
  tag names: ``latest`` and ``stable`` are :data:`DEBIAN_STABLE`); an Ubuntu base is refused (its
  packages come from Ubuntu's archive, not Debian's: a Debian root filesystem would approximate it);
- ``RUN apt-get update``, ``RUN apt-get install [-y] [--no-install-recommends] PKG...`` (also joined
  with ``&&``, and ``rm -rf /var/lib/apt/lists/*`` as cleanup);
- ``COPY SRC... DST`` from the task's ``environment/`` directory (no ``--from``, no URLs);
- ``WORKDIR``, ``ENV KEY=VALUE`` / ``ENV KEY VALUE``.

Anything else (another base image, ``pip``/``curl`` in ``RUN``, ``ADD``, ``USER``, multi-stage
builds, ...) raises :class:`~dressage.errors.ConfigError` naming the task and the line: it is never
approximated, because a task run in a different environment than its authors meant gives rewards
that mean something else.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dressage.errors import ConfigError

DEBIAN_STABLE = "trixie"
"""Debian's current stable release, what ``debian:latest`` and ``debian:stable`` are (Debian 13 since
August 2025). Recorded by name, so a plan (and its cached root filesystem) does not change when
Debian releases the next one; move it then, on purpose."""
DEBIAN_TAGS: dict[str, str] = {
    **{tag: "bookworm" for tag in ("bookworm", "bookworm-slim", "12", "12-slim")},
    **{tag: "trixie" for tag in ("trixie", "trixie-slim", "13", "13-slim")},
    **{tag: "bullseye" for tag in ("bullseye", "bullseye-slim", "11", "11-slim")},
    **{tag: DEBIAN_STABLE for tag in ("latest", "stable", "stable-slim")},
}
"""The ``debian:<tag>`` images a root filesystem is built for, and the Debian release each one is
(``-slim`` images hold the same release's packages with documentation left out)."""
_BASE = re.compile(r"^(debian|ubuntu)(?::([A-Za-z0-9._-]+))?$")
_PKG = re.compile(r"^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class RootfsPlan:
    """What a whitelisted Dockerfile asks for: a Debian suite, packages, copies, workdir, env."""

    base: str
    suite: str
    packages: list[str] = field(default_factory=list)
    copies: list[tuple[str, str]] = field(default_factory=list)
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The plan as JSON (stored with the task; its digest names the cached rootfs)."""
        return {
            "base": self.base,
            "suite": self.suite,
            "packages": sorted(set(self.packages)),
            "copies": [list(c) for c in self.copies],
            "workdir": self.workdir,
            "env": dict(self.env),
        }


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations; drop comments and blanks; keep the first physical line number."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _run_packages(task: str, lineno: int, command: str) -> list[str]:
    """The packages of a whitelisted ``RUN`` (apt-get update/install and list cleanup only)."""
    packages: list[str] = []
    for part in re.split(r"\s*&&\s*", command.strip()):
        try:
            words = shlex.split(part)
        except ValueError as e:
            raise ConfigError(f"task {task}: Dockerfile line {lineno}: cannot parse RUN ({e})") from None
        words = [w for w in words if w not in ("DEBIAN_FRONTEND=noninteractive",)]
        if words[:2] in (["apt-get", "update"], ["apt", "update"]) and len(words) <= 3:
            continue
        if words[:2] in (["rm", "-rf"], ["rm", "-fr"]) and all(
            w.startswith("/var/lib/apt/lists") for w in words[2:]
        ):
            continue
        if words[:2] in (["apt-get", "install"], ["apt", "install"]):
            for w in words[2:]:
                if w in ("-y", "-yq", "-qy", "-q", "--yes", "--no-install-recommends", "-qq"):
                    continue
                if not _PKG.match(w):
                    raise ConfigError(
                        f"task {task}: Dockerfile line {lineno}: {w!r} is not a Debian package name; "
                        "only 'apt-get install PKG...' is supported"
                    )
                packages.append(w.split("=")[0])
            continue
        raise ConfigError(
            f"task {task}: Dockerfile line {lineno}: RUN {part[:80]!r} is refused: only apt-get "
            "update/install runs here (no pip, curl or scripts; see docs/harbor.md)"
        )
    return packages


def _debian_suite(where: str, image: str) -> str:
    """The Debian release a ``FROM`` image is, else :class:`ConfigError` naming the line and the image."""
    name, _, tag = image.partition(":")
    if name == "ubuntu":
        raise ConfigError(
            f"{where}: base image {image!r} is refused: Ubuntu's packages are not Debian's, and a "
            "Debian root filesystem would only approximate it; use FROM debian:<tag> "
            f"({', '.join(sorted(set(DEBIAN_TAGS.values())))}), or run the task on E2B (sandbox.provider: e2b), "
            "which builds its image as written"
        )
    suite = DEBIAN_TAGS.get(tag or "latest")
    if suite is None:
        raise ConfigError(
            f"{where}: base image {image!r} is refused; use debian:<tag>, a tag of {sorted(DEBIAN_TAGS)}"
        )
    return suite


def parse_dockerfile(task: str, text: str) -> RootfsPlan:
    """A :class:`RootfsPlan` for a whitelisted Dockerfile, else :class:`ConfigError` naming the line."""
    plan: RootfsPlan | None = None
    for lineno, line in logical_lines(text):
        instr, _, rest = line.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        where = f"task {task}: Dockerfile line {lineno}"
        if instr == "FROM":
            if plan is not None:
                raise ConfigError(f"{where}: multi-stage builds are refused")
            m = _BASE.match(rest)
            if not m:
                raise ConfigError(
                    f"{where}: base image {rest!r} is refused: only debian:<tag> becomes a Debian root "
                    "filesystem here"
                )
            plan = RootfsPlan(base=f"{m.group(1)}:{m.group(2) or 'latest'}", suite=_debian_suite(where, rest))
            continue
        if plan is None:
            raise ConfigError(f"{where}: {instr} before FROM")
        if instr == "RUN":
            plan.packages += _run_packages(task, lineno, rest)
        elif instr == "WORKDIR":
            if not rest.startswith("/"):
                raise ConfigError(f"{where}: WORKDIR must be absolute")
            plan.workdir = rest
        elif instr == "ENV":
            if "=" in rest.split(" ", 1)[0]:
                for item in shlex.split(rest):
                    k, _, v = item.partition("=")
                    if not _ENV_KEY.match(k):
                        raise ConfigError(f"{where}: bad ENV name {k!r}")
                    plan.env[k] = v
            else:
                k, _, v = rest.partition(" ")
                if not _ENV_KEY.match(k):
                    raise ConfigError(f"{where}: bad ENV name {k!r}")
                plan.env[k] = v.strip()
        elif instr == "COPY":
            words = shlex.split(rest)
            if any(w.startswith("--") for w in words) or len(words) < 2:
                raise ConfigError(f"{where}: only 'COPY SRC... DST' from environment/ is supported")
            dst = words[-1]
            if not dst.startswith("/") and plan.workdir is None:
                raise ConfigError(f"{where}: relative COPY destination without a WORKDIR")
            dst = dst if dst.startswith("/") else f"{plan.workdir}/{dst}"
            for src in words[:-1]:
                if src.startswith("/") or ".." in src.split("/") or "://" in src:
                    raise ConfigError(f"{where}: COPY source {src!r} must be inside environment/")
                plan.copies.append((src, dst))
        else:
            raise ConfigError(
                f"{where}: {instr} is refused: only FROM debian, RUN apt-get, COPY, WORKDIR and "
                "ENV are supported (see docs/harbor.md)"
            )
    if plan is None:
        raise ConfigError(f"task {task}: Dockerfile has no FROM")
    return plan


def rootfs_plan(plan: RootfsPlan, env_dir: Path) -> dict[str, object]:
    """The JSON plan of a task's root filesystem: ``COPY``s into the workdir left out (they seed the
    workspace, which is bound over the workdir), ``context`` the task's ``environment/`` directory."""
    workdir = (plan.workdir or "/app").rstrip("/")
    copies = [[s, d] for s, d in plan.copies if not (d.rstrip("/") == workdir or d.startswith(workdir + "/"))]
    return {**plan.to_json(), "copies": copies, "context": str(env_dir.resolve())}


def rootfs_key(plan: dict[str, Any]) -> str:
    """sha256 of the plan (context path left out) and the bytes of every file it copies."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in plan.items() if k != "context"}, sort_keys=True).encode())
    context = Path(plan["context"])
    for src, _dst in plan["copies"]:
        source = context / src
        for f in sorted([source] if source.is_file() else source.rglob("*")):
            if f.is_file():
                h.update(f.relative_to(context).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:32]
