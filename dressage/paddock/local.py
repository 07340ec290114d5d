"""The ``local`` provider: plain subprocesses in a temporary directory. NO isolation.

For development and tests on machines without bubblewrap. Commands see the host filesystem, network
and environment variables given to them (the environment is still cleaned like bwrap's, so secrets in
the worker's environment do not leak by accident). Each command runs in its own process group, which
is killed at the timeout and when the command's main process exits, so background children do not
outlive their ``exec`` (the same semantics as the bwrap provider). No limit of the spec is enforced
(``memory_mb``, ``max_processes``, ``disk_mb``): that is what ``bwrap`` is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from dressage.errors import NotSupportedError
from dressage.paddock._proc import run_capped
from dressage.paddock.base import (
    ExecRequest,
    ExecResult,
    HostWorkspaceSandbox,
    SandboxProvider,
    SandboxSpec,
    resolve_in_workspace,
    seed_workspace,
)
from dressage.paddock.limits import LimitsInForce

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def clean_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The small environment every sandboxed command starts from (nothing inherited from the host)."""
    env = {"PATH": DEFAULT_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
    env.update(extra or {})
    return env


def _killpg(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class LocalSandbox(HostWorkspaceSandbox):
    """A temp directory and unconfined subprocesses; see the module docstring."""

    def __init__(self, session_id: str, spec: SandboxSpec, root: Path) -> None:
        self.session_id = session_id
        self.spec = spec
        self.root = root
        self._procs: set[asyncio.subprocess.Process] = set()
        self._terminated = False

    async def _exec(self, req: ExecRequest) -> ExecResult:
        """Run a command in the workspace (its own process group); see :meth:`Sandbox.exec`."""
        workdir = resolve_in_workspace(self.root, req.cwd or ".")
        full_env = clean_env(str(self.root), req.env_over(self.spec.env))
        return await run_capped(
            req.argv,
            env=full_env,
            cwd=str(workdir),
            stdin=req.stdin,
            timeout=self._timeout(req.timeout),
            cap=self.spec.output_cap_bytes,
            grace=self.spec.kill_grace_s,
            send_signal=_killpg,
            after_exit=lambda p: _killpg(p, signal.SIGKILL),
            on_start=self._procs.add,
        )

    async def terminate(self) -> None:
        """Kill every process group this sandbox started and delete the workspace."""
        if self._terminated:
            return
        self._terminated = True
        for p in list(self._procs):
            _killpg(p, signal.SIGKILL)
        self._procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)


class LocalProvider(SandboxProvider):
    """Creates :class:`LocalSandbox` instances, warning loudly each time."""

    name = "local"

    async def limits_in_force(self, spec: SandboxSpec) -> LimitsInForce:
        """Nothing: local commands run unisolated, whatever ``memory_mb`` / ``max_processes`` say."""
        return LimitsInForce("none", "provider local enforces no memory or process limit")

    async def create(self, session_id: str, spec: SandboxSpec) -> LocalSandbox:
        """Make a temp workspace, seed it, and warn that nothing is isolated."""
        if spec.image:
            raise NotSupportedError("spec.image needs sandbox provider 'image' (sandbox.provider: image)")
        if spec.mounts or spec.rootfs:
            raise NotSupportedError(
                "sandbox provider 'local' has no mount namespace: spec.mounts / spec.rootfs (Harbor "
                "tasks) need provider 'bwrap'"
            )
        msg = (
            f"sandbox provider 'local' for session {session_id}: commands run UNISOLATED on this host "
            "(no filesystem, network, memory or process limits). Use provider 'bwrap' or 'e2b' for RL runs."
        )
        log.warning(msg)
        with contextlib.suppress(ImportError):
            from rich.console import Console

            Console(stderr=True).print(f"[bold red]WARNING[/]: {msg}")
        root = Path(tempfile.mkdtemp(prefix=f"dressage-local-{_safe(session_id)}-"))
        seed_workspace(root, spec.files)
        return LocalSandbox(session_id, spec, root)


def _safe(session_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in session_id)[:40]
