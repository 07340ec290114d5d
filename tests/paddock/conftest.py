"""Fixtures for the paddock tests: one provider per backend, real processes everywhere."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator

import pytest

from dressage.errors import SandboxUnavailableError
from dressage.paddock import Sandbox, SandboxSpec, get_provider
from dressage.paddock.bwrap import check_bwrap, find_bwrap


@functools.cache
def bwrap_unavailable_reason() -> str | None:
    """Why real bubblewrap tests cannot run here, or None (checked once per session)."""
    try:
        check_bwrap(find_bwrap())
    except SandboxUnavailableError as e:
        return str(e)
    return None


requires_bwrap = pytest.mark.skipif(
    bwrap_unavailable_reason() is not None, reason=str(bwrap_unavailable_reason())
)
"""Marks the tests that run real bubblewrap sandboxes (imported by every suite that needs one)."""

SPEC = dict(timeout_s=10.0, max_processes=64, memory_mb=512, output_cap_bytes=4096, kill_grace_s=0.5)


@pytest.fixture(params=["bwrap", "local", "e2b"])
async def any_sandbox(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Sandbox]:
    """The same contract runs on every provider (e2b against the local fake server)."""
    name = request.param
    if name == "bwrap" and bwrap_unavailable_reason():
        pytest.skip(bwrap_unavailable_reason())
    kwargs: dict[str, object] = {}
    if name == "e2b":
        fake = request.getfixturevalue("fake_e2b")
        kwargs = {"api_url": fake.url, "sandbox_url": fake.url, "api_key": "e2b_fake"}
    provider = get_provider(name, **kwargs)
    spec = SandboxSpec(provider=name, files={"seed.txt": "seeded\n"}, **SPEC)
    sb = await provider.create(f"test-{name}", spec)
    try:
        yield sb
    finally:
        await sb.terminate()


@pytest.fixture
def fake_e2b():
    """A real HTTP server on loopback speaking E2B's control-plane REST and envd Connect-RPC."""
    from tests.paddock.fake_e2b import FakeE2B

    with FakeE2B() as server:
        yield server


@pytest.fixture
def secret_env():
    os.environ["DRESSAGE_TEST_SECRET"] = "hunter2"
    yield "hunter2"
    os.environ.pop("DRESSAGE_TEST_SECRET", None)
