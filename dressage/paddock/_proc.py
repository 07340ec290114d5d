"""Run one host process with a wall-clock limit and capped, incrementally read output.

Shared by the ``local`` and ``bwrap`` providers. How the process tree is signalled is the
provider's business (a process group for ``local``, a cgroup / PID namespace for ``bwrap``), so the
caller passes ``send_signal``; this module only decides *when*: SIGTERM at the deadline, SIGKILL
after the grace period, and a final SIGKILL sweep (``after_exit``) once the main process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Mapping

from dressage.errors import SandboxError
from dressage.paddock.base import ExecResult

_CHUNK = 64 * 1024


async def _drain(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read a stream to EOF, keeping at most ``cap`` bytes; the rest is read and dropped."""
    kept = bytearray()
    truncated = False
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(kept), truncated
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True


async def _feed(writer: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if writer is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 137
    return 128 - returncode if returncode < 0 else returncode


async def _wait_or_kill(
    proc: asyncio.subprocess.Process,
    timeout: float,
    grace: float,
    send_signal: Callable[[asyncio.subprocess.Process, int], None],
) -> bool:
    """Wait for ``proc`` up to ``timeout``; past it SIGTERM, ``grace`` seconds, SIGKILL. True: it timed out."""
    try:
        await asyncio.wait_for(proc.wait(), timeout)
        return False
    except TimeoutError:
        send_signal(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            pass
        send_signal(proc, signal.SIGKILL)
        await proc.wait()
        return True


def _drained(task: asyncio.Task[tuple[bytes, bool]]) -> tuple[bytes, bool]:
    """A drain task's ``(bytes, truncated)``; nothing, truncated, when it was cancelled or failed."""
    return task.result() if not task.cancelled() and task.exception() is None else (b"", True)


async def run_capped(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    stdin: bytes | str | None,
    timeout: float,
    cap: int,
    grace: float,
    send_signal: Callable[[asyncio.subprocess.Process, int], None],
    after_exit: Callable[[asyncio.subprocess.Process], None] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    on_start: Callable[[asyncio.subprocess.Process], None] | None = None,
    pass_fds: tuple[int, ...] = (),
    executable: str | None = None,
) -> ExecResult:
    """Start ``argv`` in a new session, feed ``stdin``, collect capped output, enforce ``timeout``.

    ``pass_fds`` stay open in the child (bubblewrap reads its arguments from one); ``executable``,
    when given, is the program run with ``argv[0]`` as its displayed name.

    Cancellation (e.g. the sandbox being terminated) kills the process tree before re-raising.
    """
    data = stdin.encode() if isinstance(stdin, str) else stdin
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,
            pass_fds=pass_fds,
            executable=executable,
        )
    except OSError as e:
        raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
    if on_start is not None:
        on_start(proc)
    assert proc.stdout is not None and proc.stderr is not None
    out_task = asyncio.create_task(_drain(proc.stdout, cap))
    err_task = asyncio.create_task(_drain(proc.stderr, cap))
    feed_task = asyncio.create_task(_feed(proc.stdin, data))
    timed_out = False
    try:
        timed_out = await _wait_or_kill(proc, timeout, grace, send_signal)
        if after_exit is not None:
            after_exit(proc)
        # Output pipes close when every holder is dead; the sweep above guarantees that, but a
        # bounded wait keeps a leaked descriptor from hanging the caller.
        left = max(1.0, timeout - (time.monotonic() - started))
        done, _ = await asyncio.wait({out_task, err_task}, timeout=left)
        if len(done) < 2:
            send_signal(proc, signal.SIGKILL)
            await asyncio.wait({out_task, err_task}, timeout=2.0)
    except asyncio.CancelledError:
        send_signal(proc, signal.SIGKILL)
        raise
    finally:
        for t in (out_task, err_task, feed_task):
            if not t.done():
                t.cancel()
        await asyncio.gather(out_task, err_task, feed_task, return_exceptions=True)
    (out, out_trunc), (err, err_trunc) = _drained(out_task), _drained(err_task)
    return ExecResult(
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        exit_code=_exit_code(proc.returncode),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        stdout_truncated=out_trunc,
        stderr_truncated=err_trunc,
    )
