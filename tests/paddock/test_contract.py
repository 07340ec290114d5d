"""The sandbox contract, run against every provider (bwrap, local, e2b via the local fake)."""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from dressage.errors import SandboxError
from dressage.paddock import Sandbox, SandboxTools

pytestmark = pytest.mark.anyio


async def test_exec_basic(any_sandbox: Sandbox) -> None:
    r = await any_sandbox.exec("cat seed.txt; echo oops >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("seeded\n", "oops\n", 3, False)
    r = await any_sandbox.exec(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.ok


async def test_exec_cwd_env_stdin(any_sandbox: Sandbox) -> None:
    await any_sandbox.write_file("sub/f.txt", "x")
    r = await any_sandbox.exec("ls; echo $FOO", cwd="sub", env={"FOO": "bar"})
    assert r.stdout.split() == ["f.txt", "bar"]
    r = await any_sandbox.exec("tr a-z A-Z", stdin="piped in")
    assert r.stdout == "PIPED IN"


async def test_env_is_clean(any_sandbox: Sandbox, secret_env: str) -> None:
    r = await any_sandbox.exec("env")
    assert secret_env not in r.stdout and "DRESSAGE_TEST_SECRET" not in r.stdout


async def test_files_roundtrip_and_listing(any_sandbox: Sandbox) -> None:
    await any_sandbox.write_file("a/b/c.bin", b"\x00\xffdata")
    assert await any_sandbox.read_file("a/b/c.bin") == b"\x00\xffdata"
    assert (await any_sandbox.exec("cat a/b/c.bin | wc -c")).stdout.strip() == "6"
    names = {(f.name, f.is_dir) for f in await any_sandbox.list_files(".")}
    assert {("a", True), ("seed.txt", False)} <= names
    [entry] = await any_sandbox.list_files("a/b")
    assert (entry.name, entry.path, entry.size) == ("c.bin", "a/b/c.bin", 6)
    with pytest.raises(SandboxError):
        await any_sandbox.read_file("missing.txt")


@pytest.mark.parametrize("bad", ["../etc/passwd", "x/../../y", "/etc/passwd", ""])
async def test_path_escapes_refused(any_sandbox: Sandbox, bad: str) -> None:
    with pytest.raises(SandboxError):
        await any_sandbox.read_file(bad)
    with pytest.raises(SandboxError):
        await any_sandbox.write_file(bad, "x")


async def test_timeout_kills(any_sandbox: Sandbox) -> None:
    t = time.monotonic()
    r = await any_sandbox.exec("trap '' TERM; sleep 60", timeout=1)
    assert r.timed_out and not r.ok and time.monotonic() - t < 8


async def test_output_capped(any_sandbox: Sandbox) -> None:
    r = await any_sandbox.exec("head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2")
    cap = any_sandbox.spec.output_cap_bytes
    assert len(r.stdout) == cap and r.stdout_truncated and not r.stderr_truncated and r.exit_code == 0


async def test_archive_contains_files(any_sandbox: Sandbox) -> None:
    await any_sandbox.write_file("out/result.txt", "42")
    await any_sandbox.exec("echo made > made.txt")
    with tarfile.open(fileobj=io.BytesIO(await any_sandbox.archive())) as tar:
        names = set(tar.getnames())
        assert {"./out/result.txt", "./made.txt", "./seed.txt"} <= names
        assert tar.extractfile("./out/result.txt").read() == b"42"


async def test_terminate_idempotent_and_final(any_sandbox: Sandbox) -> None:
    await any_sandbox.terminate()
    await any_sandbox.terminate()
    with pytest.raises(SandboxError):
        await any_sandbox.exec("true")


async def test_tools(any_sandbox: Sandbox) -> None:
    tools = SandboxTools(any_sandbox)
    assert [s["function"]["name"] for s in tools.schemas] == ["shell_exec", "file_read", "file_write"]
    assert "wrote 5 bytes" in await tools.call("file_write", '{"path": "t.txt", "content": "hello"}')
    assert await tools.call("file.read", '{"path": "t.txt"}') == "hello"
    out = await tools.call("shell_exec", '{"cmd": "cat t.txt; exit 2"}')
    assert out.startswith("exit_code: 2") and "hello" in out
    for name, args, needle in [
        ("shell_exec", "{not json", "not valid JSON"),
        ("shell_exec", "{}", "missing required argument 'cmd'"),
        ("file_read", '{"path": 3}', "must be a str"),
        ("file_read", '{"path": "../x"}', "escapes"),
        ("nope", "{}", "unknown tool"),
        ("shell_exec", '{"cmd": "true", "timeout": -1}', "positive"),
    ]:
        res = await tools.call(name, args)
        assert res.startswith("error:") and needle in res, res
