"""Provider ``docker`` on the REAL container engine found here (Podman on CI): limits, time, processes,
network, the proxy socket, secrets, and the removal of a killed worker's containers. Tier external;
without an engine every test skips with the reason (a failure under DRESSAGE_REQUIRE_ALL=1)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dressage.errors import SandboxError
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from dressage.paddock import container_engine as ce
from dressage.paddock.docker import DockerSandbox
from tests.paddock.conftest import SPEC, container_image

pytestmark = pytest.mark.anyio

SCAN = (
    "import os, sys\n"
    "needle = (sys.argv[1] + sys.argv[2]).encode()\n"
    "hits = [p for p in os.listdir('/proc') if p.isdigit() and needle in "
    "open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ')]\n"
    "print(len(hits))\n"
)
"""Counts the processes inside whose command line holds ``argv[1] + argv[2]`` (the needle comes in two
halves so that the scan's own command line does not hold it)."""


@pytest.fixture
async def image() -> str:
    return await container_image()


@pytest.fixture
async def sb(image: str) -> AsyncIterator[DockerSandbox]:
    s = await get_provider("docker").create("dk", SandboxSpec(provider="docker", image=image, **SPEC))
    assert isinstance(s, DockerSandbox)
    yield s
    await s.terminate()


async def _running(sb: DockerSandbox, needle: str) -> int:
    """How many processes inside run a command line containing ``needle``."""
    half = len(needle) // 2
    r = await sb.exec(["python3", "-c", SCAN, needle[:half], needle[half:]])
    assert r.exit_code == 0, r
    return int(r.stdout)


async def test_limits_in_force_and_held(image: str, sb: DockerSandbox) -> None:
    limits = await get_provider("docker").limits_in_force(sb.spec)
    assert limits.mechanism == "cgroup" and "--pids-limit 70" in limits.detail, limits
    r = await sb.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
    assert r.stdout.strip() == "70", r
    r = await sb.exec(["python3", "-c", "b = bytearray(1500 * 1024 * 1024); print('allocated')"])
    assert r.exit_code != 0 and "allocated" not in r.stdout, r


async def test_timeout_kills_the_whole_exec(sb: DockerSandbox) -> None:
    t = time.monotonic()
    r = await sb.exec("trap '' TERM; (trap '' TERM; sleep 300.25) & sleep 300.25", timeout=1)
    assert r.timed_out and r.exit_code == 137 and time.monotonic() - t < 8, r
    assert await _running(sb, "sleep 300.25") == 0
    assert (await sb.exec("echo still usable")).stdout == "still usable\n"


async def test_background_children_end_with_their_exec(sb: DockerSandbox) -> None:
    t = time.monotonic()
    r = await sb.exec("sleep 300.5 & echo started")
    assert r.stdout == "started\n" and r.ok and time.monotonic() - t < 8, r
    assert await _running(sb, "sleep 300.5") == 0


async def test_network_off(sb: DockerSandbox, host_http: int) -> None:
    r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 || cat /proc/net/dev")
    assert "lo" in r.stdout and "eth0" not in r.stdout, r
    code = f"import socket; s = socket.socket(); s.settimeout(2); print(s.connect_ex(('127.0.0.1', {host_http})))"
    r = await sb.exec(["python3", "-c", code])
    assert r.exit_code == 0 and r.stdout.strip() != "0", r


async def test_proxy_socket_reaches_host_without_network(tmp_path: Path, image: str, host_http: int) -> None:
    sock = str(tmp_path / "proxy.sock")
    server = await serve_unix_socket_forwarder(sock, "127.0.0.1", host_http)
    try:
        spec = SandboxSpec(provider="docker", image=image, **SPEC, proxy_socket=sock, proxy_port=18080)
        async with await get_provider("docker").create("px", spec) as sb:
            fetch = "import os,urllib.request as u; print(u.urlopen(os.environ['DRESSAGE_PROXY_URL']).read().decode())"
            r = await sb.exec(["python3", "-c", fetch])
            assert r.stdout.strip() == "hello from host", r
            direct = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{host_http}', timeout=2)"
            r = await sb.exec(["python3", "-c", direct])
            assert r.exit_code != 0 and "refused" in r.stderr.lower(), r
    finally:
        server.close()


async def test_env_values_never_on_a_command_line(sb: DockerSandbox) -> None:
    secret = "s3cr3t-value-0xdeadbeef"
    run = asyncio.ensure_future(sb.exec('sleep 2; printf %s "$TOKEN"', env={"TOKEN": secret}))
    seen: list[str] = []
    while not run.done():
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if secret in cmdline:
                    seen.append(cmdline)
        await asyncio.sleep(0.05)
    assert (await run).stdout == secret
    assert seen == []


async def test_missing_image_refused_naming_it() -> None:
    spec = SandboxSpec(provider="docker", image="localhost/dressage-no-such-image:0", **SPEC)
    with pytest.raises(SandboxError, match=r"sandbox\.image 'localhost/dressage-no-such-image:0'"):
        await get_provider("docker").create("none", spec)


_WORKER = """
import asyncio, sys
from dressage.paddock import SandboxSpec, get_provider
async def main():
    sb = await get_provider("docker", run="orphan-test").create("orphaned", SandboxSpec(
        provider="docker", image=sys.argv[1], timeout_s=10.0, max_processes=64, memory_mb=512))
    print(sb.container, sb.root.parent, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_killed_workers_containers_are_removed(image: str, sb: DockerSandbox) -> None:
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WORKER, image, stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    assert worker.stdout is not None
    line = await asyncio.wait_for(worker.stdout.readline(), 120)
    container, workspace = line.decode().split()
    os.kill(worker.pid, signal.SIGKILL)
    await worker.wait()
    engine = await ce.find_engine()
    assert await ce.labelled(engine, ce.LABEL_RUN, "orphan-test")  # it outlived its worker
    removed = await get_provider("docker").remove_orphans()
    assert await ce.labelled(engine, ce.LABEL_RUN, "orphan-test") == []
    assert not Path(workspace).exists() and len(removed) >= 1
    assert (await sb.exec("echo alive")).stdout == "alive\n"  # a live worker's container stays
    assert container.startswith("dressage-")


async def test_image_user_owns_the_workspace() -> None:
    image = await container_image(user="1000")
    spec = SandboxSpec(provider="docker", image=image, files={"seed.txt": "s"}, **SPEC)
    async with await get_provider("docker").create("user", spec) as sb:
        assert (await sb.exec("id -u")).stdout == "1000\n"
        await sb.write_file("late/added.txt", "a")
        r = await sb.exec(
            "echo x >> seed.txt && echo y >> late/added.txt && echo z > late/new.txt && cat late/*"
        )
        assert r.ok and r.stdout == "ay\nz\n", r
        assert await sb.read_file("seed.txt") == b"sx\n"
