"""Sandbox limits as configured, or a refusal: fork bombs on REAL bubblewrap, as root and as non-root.

A fork bomb runs in the default sandbox (``sandbox.limits`` as the worker offers it) while this
test counts, from the host, the processes of the sandbox's PID namespace (or of its host uid): the
count must stay within ``max_processes`` plus bubblewrap's own and a little slack, the host must go
on forking, and once the command's time is up nothing of it may be left. The non-root worker is a
real unprivileged uid (``setpriv``), for which the cgroup hierarchy is not writable: the condition
that makes a config accepting only ``cgroup`` refuse to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dressage.errors import SandboxError, SandboxUnavailableError
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from tests.paddock.conftest import requires_bwrap, requires_open_checkout

pytestmark = [requires_bwrap, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
MAX_PROCESSES = 32
# Bubblewrap's own processes (outer bwrap, the namespace's init) are charged too; a /proc listing
# under a fork bomb is not atomic, so a process may be seen exiting while its successor appears.
SLACK = 4 + 12
BOMB = ":(){ :|:& };:"
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged uid needs root")


def _procs() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path(path).read_text()
    return None


def _uid_of(pid: int) -> int | None:
    status = _read(f"/proc/{pid}/status") or ""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def _bwrap_of(marker: str) -> int | None:
    """The outer bubblewrap running the command that holds ``marker`` (its argv shows the command)."""
    for pid in _procs():
        cmd = _read(f"/proc/{pid}/cmdline") or ""
        if cmd.startswith("bwrap\0") and marker in cmd:
            return pid
    return None


def _pid_ns_of_children(pid: int) -> str | None:
    """The PID namespace of ``pid``'s children (bubblewrap's sandbox), as ``pid:[inode]``."""
    for child in (_read(f"/proc/{pid}/task/{pid}/children") or "").split():
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/{child}/ns/pid")
    return None


def _in_ns(ns: str) -> list[int]:
    found = []
    for pid in _procs():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                found.append(pid)
    return found


async def _watch_bomb(sb, marker: str) -> tuple[int, int, set[int], str]:
    """Run the fork bomb for 3 s; return (most processes seen at once, samples, their host uids, ns)."""
    run = asyncio.ensure_future(sb.exec(["bash", "-c", f"{BOMB}; sleep 30 # {marker}"], timeout=3))
    most, samples, uids, ns = 0, 0, set(), None
    while not run.done():
        if ns is None:
            outer = _bwrap_of(marker)
            ns = _pid_ns_of_children(outer) if outer else None
        if ns is not None:
            pids = _in_ns(ns)
            most, samples = max(most, len(pids)), samples + 1
            uids.update(u for u in map(_uid_of, pids[:5]) if u is not None)
            assert subprocess.run(["true"]).returncode == 0  # the host still forks
        await asyncio.sleep(0.05)
    result = await run
    assert result.timed_out, result
    assert ns is not None, "the sandbox's PID namespace was never seen"
    return most, samples, uids, ns


def _assert_nothing_left(ns: str, marker: str) -> None:
    for _ in range(100):
        if not _in_ns(ns) and _bwrap_of(marker) is None:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes left in {ns}: {_in_ns(ns)}")


def _assert_no_process_of(uid: int) -> None:
    left: list[tuple[int, str | None]] = []
    for _ in range(100):
        left = [(pid, _read(f"/proc/{pid}/stat")) for pid in _procs() if _uid_of(pid) == uid]
        if not left:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of uid {uid} left: {left}")


@pytest.mark.parametrize("limits", [("cgroup",), ("rlimit",)])
async def test_fork_bomb_in_the_default_sandbox_is_contained_for_a_root_worker(limits) -> None:
    if os.geteuid() != 0:
        pytest.skip("this case is the root worker's (the non-root one is the next test)")
    provider = get_provider("bwrap")
    spec = SandboxSpec(max_processes=MAX_PROCESSES, memory_mb=512, kill_grace_s=0.5, limits=limits)
    try:
        in_force = await provider.limits_in_force(spec)
    except SandboxUnavailableError as e:
        pytest.skip(f"{limits[0]} is not available here: {e}")
    assert in_force.mechanism == limits[0]
    marker = f"bomb-{secrets.token_hex(4)}"
    async with await provider.create("bomb", spec) as sb:
        most, samples, uids, ns = await _watch_bomb(sb, marker)
        assert samples >= 3
        assert MAX_PROCESSES / 2 < most <= MAX_PROCESSES + SLACK, most
        if limits == ("rlimit",):
            # RLIMIT_NPROC does not hold for host root: the sandbox runs as a uid of its own.
            assert uids and 0 not in uids, uids
        _assert_nothing_left(ns, marker)
        assert (await sb.exec("echo ok")).stdout == "ok\n"  # the sandbox itself still works


_NON_ROOT_WORKER = """
import asyncio, json, sys
from dressage.errors import SandboxError, SandboxUnavailableError
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder

async def main():
    out = {}
    for name, limits in (("strict", ("cgroup",)), ("default", ("cgroup", "rlimit"))):
        spec = SandboxSpec(max_processes=int(sys.argv[2]), memory_mb=512, kill_grace_s=0.5, limits=limits)
        try:
            out[name] = (await get_provider("bwrap").limits_in_force(spec)).line()
        except SandboxUnavailableError as e:
            out[name] = "refused: " + str(e)
    print(json.dumps(out), flush=True)
    sb = await get_provider("bwrap").create("bomb", spec)
    r = await sb.exec(["bash", "-c", sys.argv[1]], timeout=3)
    await sb.terminate()
    print(json.dumps({"timed_out": r.timed_out}), flush=True)

asyncio.run(main())
"""


@requires_root
@requires_open_checkout
async def test_a_non_root_worker_is_refused_a_cgroup_it_lacks_and_contains_a_fork_bomb_with_rlimits() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run the worker as an unprivileged uid")
    uid = 1_400_000_000 + secrets.randbelow(1 << 20)
    marker = f"bomb-{secrets.token_hex(4)}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HOME": "/nonexistent"}
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable]
    worker = subprocess.Popen(
        [*argv, "-c", _NON_ROOT_WORKER, f"{BOMB}; sleep 30 # {marker}", str(MAX_PROCESSES)],
        cwd="/",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        answers = json.loads(worker.stdout.readline() or "{}")
        assert answers, worker.stderr.read() if worker.stderr else ""
        # Refused, in one line naming the limits, the mechanism and why it is missing.
        strict = answers["strict"]
        assert strict.startswith(
            "refused: sandbox limits refused: max_processes 32 and memory_mb 512 need a cgroup"
        )
        assert "Permission denied" in strict and "sandbox.limits accepts [cgroup]" in strict
        assert "\n" not in strict
        assert answers["default"].startswith(
            "sandbox limits: rlimit (RLIMIT_NPROC 36 over every process of uid"
        )
        most = samples = 0
        while worker.poll() is None:
            # Every process of that uid: the worker's own python and the whole sandbox.
            count = sum(1 for pid in _procs() if _uid_of(pid) == uid)
            most, samples = max(most, count), samples + 1
            assert subprocess.run(["true"]).returncode == 0
            time.sleep(0.05)
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"timed_out": True}
        assert samples >= 3
        assert MAX_PROCESSES / 2 < most <= MAX_PROCESSES + SLACK, most
        _assert_no_process_of(uid)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@requires_root
@requires_open_checkout
async def test_a_root_workers_rlimit_sandbox_owns_its_workspace_and_reaches_the_proxy_socket(
    tmp_path: Path,
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    host = await asyncio.start_server(answer, "127.0.0.1", 0)
    # Where the worker puts it: a private folder in the temp dir, opened to the sandbox's uid.
    sock_dir = Path(tempfile.mkdtemp(prefix="dressage-test-proxy-"))
    sock = str(sock_dir / "proxy.sock")
    forwarder = await serve_unix_socket_forwarder(sock, "127.0.0.1", host.sockets[0].getsockname()[1])
    spec = SandboxSpec(max_processes=MAX_PROCESSES, memory_mb=512, limits=("rlimit",), proxy_socket=sock)
    try:
        async with await get_provider("bwrap").create("own", spec) as sb:
            await sb.write_file("made/by/host.txt", "host\n")  # written by root on the host side
            r = await sb.exec("echo sandbox >> made/by/host.txt && touch made/by/new && cat made/by/host.txt")
            assert r.ok and r.stdout == "host\nsandbox\n", r
            assert os.stat(sb.root / "made" / "by" / "new").st_uid not in (0, os.geteuid())
            fetch = "import os,urllib.request as u; print(u.urlopen(os.environ['DRESSAGE_PROXY_URL']).read().decode())"
            r = await sb.exec(["python3", "-c", fetch])
            assert r.stdout.strip() == "hello", r
    finally:
        forwarder.close()
        host.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
    # A socket below a folder other users cannot search: refused, saying which folder.
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "open").mkdir(mode=0o755)
    sock = str(hidden / "open" / "proxy.sock")
    forwarder = await serve_unix_socket_forwarder(sock, "127.0.0.1", 9)
    try:
        with pytest.raises(
            SandboxError, match=f"cannot reach the proxy socket {sock}: {hidden} is not searchable"
        ):
            await get_provider("bwrap").create("hidden", dataclasses.replace(spec, proxy_socket=sock))
    finally:
        forwarder.close()
