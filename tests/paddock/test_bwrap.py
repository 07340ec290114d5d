"""Containment on REAL bubblewrap: files, network, processes, output, time, env, cleanup.

Each test runs on the ``bwrap`` provider and on the ``image`` provider (the same sandbox over an
OCI image's root filesystem; fixture ``isolated``)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dressage.errors import SandboxError
from dressage.paddock import serve_unix_socket_forwarder
from tests.paddock.conftest import Isolated, requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.anyio]


@pytest.fixture
async def sb(isolated: Isolated):
    s = await isolated.provider().create("bw", isolated.spec())
    yield s
    await s.terminate()


@pytest.fixture
def host_http():
    """A real HTTP server on the host loopback that answers 'hello from host'."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello from host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


async def test_host_files_invisible_and_unwritable(sb, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    r = await sb.exec(f"cat {victim}; echo x > {victim}; echo y > /usr/evil; ls /root /work /home")
    assert r.exit_code != 0
    assert "original" not in r.stdout
    assert victim.read_text() == "original"
    assert not Path("/usr/evil").exists()


async def test_api_refuses_escapes(sb, tmp_path: Path) -> None:
    for bad in ("../x", "a/../../x", "/etc/passwd", "/workspace/../etc/passwd"):
        with pytest.raises(SandboxError):
            await sb.read_file(bad)
        with pytest.raises(SandboxError):
            await sb.write_file(bad, "x")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    await sb.exec(f"ln -s {outside} link.txt; ln -s / rootlink")
    os.symlink(outside, sb.root / "hostlink.txt")  # a link the sandbox could not make itself
    for bad in ("link.txt", "hostlink.txt", "rootlink/etc/passwd"):
        with pytest.raises(SandboxError):
            await sb.read_file(bad)
    with pytest.raises(SandboxError):
        await sb.write_file("hostlink.txt", "pwned")
    assert outside.read_text() == "secret"


async def test_network_off(sb, host_http: int) -> None:
    code = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(2)\n"
        f"print(s.connect_ex(('127.0.0.1', {host_http})))\n"
    )
    r = await sb.exec(["python3", "-c", code])
    assert r.exit_code == 0 and r.stdout.strip() != "0", r
    r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
    assert r.stdout.split() == ["lo"]


async def test_proxy_socket_reaches_host_without_network(
    isolated: Isolated, tmp_path: Path, host_http: int
) -> None:
    sock = str(tmp_path / "proxy.sock")
    server = await serve_unix_socket_forwarder(sock, "127.0.0.1", host_http)
    try:
        spec = isolated.spec(proxy_socket=sock, proxy_port=18080)
        async with await isolated.provider().create("px", spec) as sb:
            fetch = "import os,urllib.request as u; print(u.urlopen(os.environ['DRESSAGE_PROXY_URL']).read().decode())"
            r = await sb.exec(["python3", "-c", fetch])
            assert r.stdout.strip() == "hello from host", r
            direct = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{host_http}', timeout=2)"
            r = await sb.exec(["python3", "-c", direct])
            assert r.exit_code != 0 and "refused" in r.stderr.lower(), r
    finally:
        server.close()


async def test_fork_bomb_contained(sb) -> None:
    t = time.monotonic()
    r = await sb.exec(["bash", "-c", ":(){ :|:& };:; sleep 30"], timeout=3)
    assert r.timed_out and time.monotonic() - t < 15
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    assert (await sb.exec("echo ok")).stdout == "ok\n"


async def test_memory_limit(sb) -> None:
    r = await sb.exec(["python3", "-c", "b = bytearray(1500 * 1024 * 1024); print('allocated')"])
    assert r.exit_code != 0 and "allocated" not in r.stdout


async def test_sigterm_ignoring_child_killed_on_timeout(sb) -> None:
    t = time.monotonic()
    r = await sb.exec("trap '' TERM; (trap '' TERM; sleep 300.25) & sleep 300.25", timeout=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - t < 5
    # The kernel ends the sandbox's pid namespace after its init dies, asynchronously: wait for that
    # (up to 10 s); a process still there after it was not killed.
    for _ in range(200):
        if not _host_procs_with("sleep 300.25"):
            break
        await asyncio.sleep(0.05)
    assert not _host_procs_with("sleep 300.25")


async def test_terminate_kills_running_and_background(isolated: Isolated, tmp_path: Path) -> None:
    sb = await isolated.provider().create("term", isolated.spec())
    task = asyncio.ensure_future(sb.exec("sleep 987.5 & sleep 987.6", timeout=60))
    for _ in range(100):
        if _host_procs_with("987.6"):
            break
        await asyncio.sleep(0.05)
    assert _host_procs_with("987.5")
    root = sb.root
    await sb.terminate()
    with pytest.raises(SandboxError):
        await task
    for _ in range(200):  # the kill reaches every process: wait for that, up to 10 s
        if not _host_procs_with("987.5") and not _host_procs_with("987.6"):
            break
        await asyncio.sleep(0.05)
    assert not _host_procs_with("987.5") and not _host_procs_with("987.6")
    assert not root.exists()
    await sb.terminate()  # idempotent


async def test_archive_of_bwrap_written_files(sb) -> None:
    await sb.exec("mkdir -p d && echo inner > d/f.txt")
    with tarfile.open(fileobj=io.BytesIO(await sb.archive())) as tar:
        assert tar.extractfile("./d/f.txt").read() == b"inner\n"


def _host_procs_with(needle: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(p.name))
            except OSError:
                pass
    return [pid for pid in found if pid != os.getpid() and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
