"""The container engine (Docker or Podman) behind sandbox provider ``docker``: found, called, swept.

The provider drives the engine's command-line client (``docker`` or ``podman``, which take the same
arguments for everything used here) rather than Docker's Python SDK: the SDK speaks only to a Docker
API socket, so Podman would need its API service running as a daemon, while both CLIs work as they
are installed; and ``exec`` through the CLI is a child process the worker can time out, kill and read
with capped output exactly like bubblewrap's (:mod:`dressage.paddock._proc`).

Which client: the ``container_engine`` setting (``DRESSAGE_CONTAINER_ENGINE``), else ``docker`` where
its daemon answers, else ``podman``. Every container the provider starts carries labels naming the
run, the session and its owner (host, worker pid and that process's start time); a worker that was
SIGKILLed cannot remove its containers, so the next worker on the host removes every container whose
owner is gone (:func:`remove_orphans`, called when a worker starts).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dressage.config import environment_values, load_settings
from dressage.errors import SandboxError, SandboxUnavailableError

LABEL_SANDBOX = "dressage.sandbox"
"""Set (to ``1``) on every container of provider ``docker``."""
LABEL_RUN = "dressage.run"
LABEL_SESSION = "dressage.session"
LABEL_OWNER = "dressage.owner"
"""``<host>:<pid>:<start time>`` of the worker process that started the container."""
LABEL_WORKSPACE = "dressage.workspace"
"""The host folder of the container's workspace (``dressage-docker-*``), removed with an orphan."""
ENGINE_TIMEOUT_S = 120.0
"""How long one engine call other than a command's ``exec`` may take (container start, removal)."""


@dataclass(frozen=True)
class Engine:
    """One usable engine client: its path, ``docker`` or ``podman``, and its version line."""

    cli: str
    kind: str
    version: str


@dataclass(frozen=True)
class EngineResult:
    """What one engine call printed and its exit status."""

    rc: int
    out: str
    err: str


async def call(
    engine: Engine | str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = ENGINE_TIMEOUT_S,
    stdin: bytes | None = None,
) -> EngineResult:
    """Run ``<cli> args...`` and wait for it (killed past ``timeout``); never raises for a failing call."""
    cli = engine.cli if isinstance(engine, Engine) else engine
    try:
        proc = await asyncio.create_subprocess_exec(
            cli,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else client_env({}),
        )
    except OSError as e:
        return EngineResult(127, "", f"cannot run {cli}: {e}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return EngineResult(124, "", f"{cli} {args[0] if args else ''} took over {timeout:.0f} s")
    return EngineResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def client_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The engine client's own environment: what it needs to find its daemon or storage, plus ``extra``
    (the values of the ``-e NAME`` of an ``exec``, so that no secret shows on a command line)."""
    found = {k: v for k, v in environment_values(("PATH", *_CLIENT_VARS)).items() if v is not None}
    return {"PATH": "/usr/bin:/bin", **found, **extra}


_CLIENT_VARS = (
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "XDG_RUNTIME_DIR",
)
"""Variables the Docker and Podman clients read to reach their daemon or storage (passed through)."""

_found: dict[str, Engine] = {}


async def find_engine() -> Engine:
    """The engine client to use (see the module doc), checked to answer; cached per process."""
    configured = load_settings().container_engine
    key = configured or ""
    if key in _found:
        return _found[key]
    tried: list[str] = []
    for cli in [configured] if configured else ["docker", "podman"]:
        path = shutil.which(cli)
        if path is None:
            tried.append(f"{cli}: not found")
            continue
        probe = await call(path, "ps", "-q", timeout=30)
        if probe.rc != 0:
            tried.append(f"{cli}: {(probe.err.strip().splitlines() or ['no answer'])[-1]}")
            continue
        version = (await call(path, "--version", timeout=30)).out.strip()
        kind = "podman" if "podman" in version.lower() else "docker"
        _found[key] = Engine(path, kind, version)
        return _found[key]
    raise SandboxUnavailableError(
        f"sandbox provider docker: no container engine answers here ({'; '.join(tried)}): start the Docker "
        "daemon, or install Podman (scripts/setup_container_engine.sh), or set DRESSAGE_CONTAINER_ENGINE"
    )


def owner_label() -> str:
    """This worker process as ``<host>:<pid>:<start time>`` (the start time tells a reused pid apart)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot), or ``""`` where the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def is_orphan(owner: str) -> bool:
    """True when ``owner`` (an :func:`owner_label`) names a process of this host that is gone."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    return _start_time(int(parts[1])) != parts[2]


async def labelled(engine: Engine, label: str, value: str | None = None) -> list[str]:
    """Ids of the containers (running or not) that carry ``label`` (equal to ``value`` when given)."""
    flt = label if value is None else f"{label}={value}"
    r = await call(engine, "ps", "-aq", "--no-trunc", "--filter", f"label={flt}")
    if r.rc != 0:
        raise SandboxError(f"{engine.kind} ps failed: {r.err.strip()}")
    return r.out.split()


async def remove_containers(engine: Engine, ids: Sequence[str]) -> None:
    """Remove the containers ``ids`` at once, killing what runs in them (their stop signal is SIGKILL)."""
    if ids:
        r = await call(engine, "rm", "-f", *ids)
        if r.rc != 0 and "no such container" not in r.err.lower():
            raise SandboxError(f"{engine.kind} rm failed: {r.err.strip()}")


async def remove_orphans(engine: Engine | None = None) -> list[str]:
    """Remove the sandbox containers of this host whose worker is gone, and their workspace folders;
    returns their ids. Containers of other hosts sharing the engine, and of live workers, are left alone."""
    engine = engine or await find_engine()
    ids = await labelled(engine, LABEL_SANDBOX)
    if not ids:
        return []
    labels = "\t".join(f'{{{{index .Config.Labels "{label}"}}}}' for label in (LABEL_OWNER, LABEL_WORKSPACE))
    r = await call(engine, "inspect", "--format", "{{.Id}}\t" + labels, *ids)
    rows = [line.split("\t") for line in r.out.splitlines() if line.count("\t") == 2]
    orphans = [(cid, workspace.strip()) for cid, owner, workspace in rows if is_orphan(owner.strip())]
    await remove_containers(engine, [cid for cid, _ in orphans])
    for _, workspace in orphans:
        folder = Path(workspace)
        if folder.is_absolute() and folder.name.startswith("dressage-docker-"):
            await asyncio.to_thread(shutil.rmtree, folder, True)
    return [cid for cid, _ in orphans]
