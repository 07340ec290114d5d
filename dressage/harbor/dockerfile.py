"""A Harbor task's ``environment/Dockerfile`` read as a plan for a Debian or Ubuntu root filesystem, or refused.

Only a strict whitelist becomes a root filesystem (built by :mod:`dressage.harbor.rootfs` with
``mmdebstrap`` from the distribution's own packages, no container runtime):

- ``FROM debian:<tag>`` for a tag of :data:`DEBIAN_TAGS` or ``FROM ubuntu:<tag>`` for a tag of
  :data:`UBUNTU_TAGS` (the plan records the release the tag names: ``debian:latest`` is
  :data:`DEBIAN_STABLE`, ``ubuntu:latest`` :data:`UBUNTU_LATEST`; :mod:`dressage.harbor.distro`); an
  unknown tag is refused, naming the line and the tag;
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
from dressage.harbor.distro import DEBIAN_STABLE, DEBIAN_TAGS, UBUNTU_LATEST, UBUNTU_TAGS, suite_of

__all__ = ["DEBIAN_STABLE", "DEBIAN_TAGS", "UBUNTU_LATEST", "UBUNTU_TAGS", "RootfsPlan", "parse_dockerfile"]

_BASE = re.compile(r"^(debian|ubuntu)(?::([A-Za-z0-9._-]+))?$")
_PKG = re.compile(r"^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class RootfsPlan:
    """What a whitelisted Dockerfile asks for: a base (``debian:<tag>`` or ``ubuntu:<tag>``) and the
    release it is, packages, copies, workdir, env; ``base_line`` (the ``FROM`` line) is not part of
    the plan's JSON (nor of its cache key)."""

    base: str
    suite: str
    packages: list[str] = field(default_factory=list)
    copies: list[tuple[str, str]] = field(default_factory=list)
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    base_line: int = 0

    @property
    def distro(self) -> str:
        """``debian`` or ``ubuntu``."""
        return self.base.partition(":")[0]

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
                        f"task {task}: Dockerfile line {lineno}: {w!r} is not a package name; "
                        "only 'apt-get install PKG...' is supported"
                    )
                packages.append(w.split("=")[0])
            continue
        raise ConfigError(
            f"task {task}: Dockerfile line {lineno}: RUN {part[:80]!r} is refused: only apt-get "
            "update/install runs here (no pip, curl or scripts; see docs/harbor.md)"
        )
    return packages


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
                    f"{where}: base image {rest!r} is refused: only debian:<tag> and ubuntu:<tag> become "
                    "a root filesystem here"
                )
            base = f"{m.group(1)}:{m.group(2) or 'latest'}"
            plan = RootfsPlan(base=base, suite=suite_of(where, base)[1], base_line=lineno)
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
                f"{where}: {instr} is refused: only FROM debian/ubuntu, RUN apt-get, COPY, WORKDIR and "
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
