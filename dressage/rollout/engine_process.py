"""Start the CPU dev engine for a rollout worker, as a child process on a free loopback port.

A subprocess (not a thread) keeps torch's compute off the worker's event loop and GIL. The child
gets ``PR_SET_PDEATHSIG`` = SIGKILL, so a worker killed with ``kill -9`` does not leave an engine
behind, and its own process group, so a terminal's Ctrl-C (sent to the whole foreground group)
reaches only the worker, which stops gracefully and stops the engine last. Its output goes to a
log file whose tail is quoted if it fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from dressage.errors import EngineError
from dressage.tls import tls_context

START_TIMEOUT_S = 180.0


def free_port() -> int:
    """An unused loopback TCP port (racy by nature; the engine fails loudly if it is taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: ask the kernel to SIGKILL us when the parent dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class DevEngineProcess:
    """``dressage-worker engine`` in a child process; ``url`` once :meth:`start` returned."""

    def __init__(self, model: str = "tiny", seed: int = 0, threads: int = 1) -> None:
        self.model, self.seed, self.threads = model, seed, threads
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = Path(tempfile.mkstemp(prefix="dressage-engine-", suffix=".log")[1])

    async def start(self) -> str:
        """Spawn the engine and wait until ``/health`` answers; return its URL."""
        argv = [
            sys.executable,
            "-c",
            "from dressage.cli import main; main()",
            "engine",
            "--port",
            str(self.port),
            "--model",
            self.model,
            "--seed",
            str(self.seed),
            "--threads",
            str(self.threads),
        ]
        log = self._log_path.open("wb")
        self._proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            process_group=0,  # a Ctrl-C to the worker's group must not stop the engine before the worker
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(timeout=2.0, verify=tls_context()) as client:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise EngineError(
                        f"the dev engine exited with code {self._proc.returncode} while starting: {self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return self.url
                await asyncio.sleep(0.25)
        self.stop()
        raise EngineError(
            f"the dev engine did not answer /health within {START_TIMEOUT_S:.0f}s: {self.log_tail()}"
        )

    @property
    def pid(self) -> int | None:
        """The engine process's id (None before :meth:`start`)."""
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """The engine's exit code once it exited (negative: killed by that signal); None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    async def restart(self) -> str:
        """Start the engine again on the same port (its URL stays), after it died; see :meth:`start`."""
        self._terminate()
        return await self.start()

    def log_tail(self, n: int = 800) -> str:
        """The last ``n`` characters of the engine's output."""
        with contextlib.suppress(OSError):
            return self._log_path.read_text(errors="replace")[-n:].strip().replace("\n", " | ")
        return ""

    def stop(self) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL after 5 s) and remove its log."""
        self._terminate()
        with contextlib.suppress(OSError):
            os.unlink(self._log_path)

    def _terminate(self) -> None:
        """Terminate the engine if it runs (SIGTERM, then SIGKILL after 5 s); reap it either way."""
        p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
