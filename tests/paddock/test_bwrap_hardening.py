"""Hardening of the bubblewrap sandbox on REAL bubblewrap (findings H1-H3 of the attack run).

H1: no nested user namespace (``unshare -r`` used to give uid 0 inside); H2: a disk quota on the
workspace and ``/tmp``; H3: no host path and no ``spec.env`` value (secrets) in any process's
command line inside the sandbox, nor in the worker's own ``ps`` view of bubblewrap.
Each holds for the ``bwrap`` and the ``image`` provider (fixture ``isolated``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dressage.errors import SandboxError
from tests.paddock.conftest import Isolated, requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.anyio]

CANARY = "canary-Zq81-not-in-any-cmdline"


async def test_nested_user_namespaces_are_refused(isolated: Isolated, tmp_path: Path) -> None:
    sb = await isolated.provider(tmp_path).create("h1", isolated.spec())
    try:
        r = await sb.exec("id -u; unshare -r id -u; echo rc=$?")
        lines = r.stdout.split()
        assert lines[0] == str(isolated.uid)
        assert "rc=0" not in r.stdout and lines[-1] != "0", r.stdout + r.stderr
        assert "unshare failed" in r.stderr
    finally:
        await sb.terminate()


async def test_no_host_path_or_env_value_in_any_cmdline(isolated: Isolated, tmp_path: Path) -> None:
    spec = isolated.spec(env={"MY_TOKEN": CANARY})
    sb = await isolated.provider(tmp_path).create("h3", spec)
    try:
        seen: list[str] = []

        async def host_side() -> None:  # the worker's view of bubblewrap while the command runs
            deadline = time.monotonic() + 30
            while not any("echo $MY_TOKEN" in c for c in seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # until the sandboxed shell (its command's text) is up
                seen[:] = []
                for p in Path("/proc").glob("[0-9]*/cmdline"):
                    try:
                        seen.append(p.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                    except OSError:
                        continue

        r, _ = await asyncio.gather(
            sb.exec(
                "sleep 1; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <$f; echo; done; echo $MY_TOKEN"
            ),
            host_side(),
        )
        inside = r.stdout.splitlines()
        assert inside[-1] == CANARY  # the command does get the value, through its environment
        cmdlines = "\n".join(inside[:-1])
        assert inside[0].startswith("bwrap --args ")
        assert CANARY not in cmdlines and str(tmp_path) not in cmdlines, cmdlines
        bwraps = [c for c in seen if c.startswith("bwrap --args")]
        assert bwraps and not any(CANARY in c or str(tmp_path) in c for c in seen)
    finally:
        await sb.terminate()


async def test_disk_quota_caps_files_tmp_and_the_workspace(isolated: Isolated, tmp_path: Path) -> None:
    spec = isolated.spec(disk_mb=8)
    sb = await isolated.provider(tmp_path).create("h2", spec)
    try:
        # (removed in the same command: the image provider's workspace also holds the image's files)
        r = await sb.exec("dd if=/dev/zero of=big bs=1M count=50 2>&1; wc -c <big; rm big")
        assert "File size limit exceeded" in r.stdout
        assert int(r.stdout.split()[-1]) <= 8 * 1024 * 1024
        r = await sb.exec("head -c 20000000 /dev/zero >/tmp/x; wc -c </tmp/x")
        assert int(r.stdout.split()[-1]) <= 8 * 1024 * 1024
        await sb.exec("head -c 5000000 /dev/zero >a")  # under the quota: fine
        with pytest.raises(SandboxError, match=r"over its disk quota of 8 MiB \(sandbox.disk_mb\)"):
            await sb.exec("head -c 5000000 /dev/zero >b")  # 10 MB in two files
        with pytest.raises(SandboxError, match="over its disk quota"):
            await sb.exec("true")  # refused from now on
    finally:
        await sb.terminate()
