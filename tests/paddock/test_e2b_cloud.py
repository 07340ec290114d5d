"""Against the real E2B cloud; skipped unless E2B_API_KEY is set."""

from __future__ import annotations

import os

import pytest

from dressage.paddock import SandboxSpec, get_provider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        not os.environ.get("E2B_API_KEY"), reason="E2B_API_KEY is not set: real E2B cloud test skipped"
    ),
]


async def test_real_e2b_roundtrip() -> None:
    spec = SandboxSpec(provider="e2b", files={"seed.txt": "seeded\n"}, timeout_s=30)
    async with await get_provider("e2b").create("cloud-test", spec) as sb:
        r = await sb.exec("cat seed.txt && echo ok")
        assert r.stdout == "seeded\nok\n"
        await sb.write_file("x.txt", "y")
        assert await sb.read_file("x.txt") == b"y"
        r = await sb.exec("sleep 30", timeout=2)
        assert r.timed_out
