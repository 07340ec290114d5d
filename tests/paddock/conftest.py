"""Fixtures for the paddock tests: one provider per backend, real processes everywhere."""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dressage.errors import SandboxUnavailableError
from dressage.paddock import Sandbox, SandboxProvider, SandboxSpec, get_provider
from dressage.paddock.bwrap import SANDBOX_UID, check_bwrap, find_bwrap
from dressage.paddock.image_store import ImageStore
from tests.paddock.images import UID


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


def closed_to_other_users() -> str | None:
    """Why an unprivileged host uid cannot reach this checkout's code and bubblewrap, or None.

    A sandbox under ``rlimit`` (and a non-root worker) runs as another uid: every folder above the
    repository, the virtualenv and the bwrap binary must let other users enter (o+x), which a checkout
    under a private folder (``mktemp -d`` makes 0700 ones) does not."""
    repo = Path(__file__).resolve().parents[2]
    for place in (repo, Path(sys.prefix).resolve(), Path(find_bwrap()).resolve().parent):
        for folder in (place, *place.parents):
            if not folder.stat().st_mode & stat.S_IXOTH:
                return f"{folder} is closed to other users (no o+x): the rlimit sandbox's own uid cannot reach {place}"
    return None


requires_open_checkout = pytest.mark.skipif(
    closed_to_other_users() is not None, reason=str(closed_to_other_users())
)
"""Marks the tests that run bubblewrap or the worker as an unprivileged host uid."""

SPEC = dict(timeout_s=10.0, max_processes=64, memory_mb=512, output_cap_bytes=4096, kill_grace_s=0.5)


IMAGE = pytest.param("image", marks=pytest.mark.slow)
"""The image provider as a parameter: its tests build an image with buildah (the slow tier)."""


@pytest.fixture(scope="session")
def image_store(tmp_path_factory: pytest.TempPathFactory) -> ImageStore:
    """One image cache for the session's image sandboxes (unpacked once, then cache hits)."""
    return ImageStore(tmp_path_factory.mktemp("image-cache"), max_mb=100_000)


@dataclass
class Isolated:
    """A provider with namespaces (``bwrap`` or ``image``), so one test checks both; ``uid``: who runs."""

    name: str
    uid: int = SANDBOX_UID
    spec_kw: dict[str, object] = field(default_factory=dict)
    store: ImageStore | None = None

    def provider(self, root_dir: Path | None = None) -> SandboxProvider:
        """A fresh provider (rooted at ``root_dir`` when given)."""
        kw: dict[str, object] = {"root_dir": root_dir} if root_dir else {}
        if self.store is not None:
            kw["store"] = self.store
        return get_provider(self.name, **kw)

    def spec(self, **kw: object) -> SandboxSpec:
        """The tests' spec (SPEC) for this provider, with ``kw`` over it."""
        return SandboxSpec(provider=self.name, **{**SPEC, **self.spec_kw, **kw})  # type: ignore[arg-type]


@pytest.fixture(params=["bwrap", IMAGE])
def isolated(request: pytest.FixtureRequest) -> Isolated:
    """``bwrap``, then ``image`` over the test image: the escape tests hold for both."""
    if request.param == "bwrap":
        return Isolated("bwrap")
    image = request.getfixturevalue("test_image")
    return Isolated("image", UID, {"image": image.oci}, request.getfixturevalue("image_store"))


@pytest.fixture(params=["bwrap", IMAGE, "local", "e2b"])
async def any_sandbox(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Sandbox]:
    """The same contract runs on every provider (e2b against the local fake server)."""
    name = request.param
    if name in ("bwrap", "image") and bwrap_unavailable_reason():
        pytest.skip(bwrap_unavailable_reason())
    kwargs: dict[str, object] = {}
    spec_kw: dict[str, object] = {}
    if name == "e2b":
        fake = request.getfixturevalue("fake_e2b")
        kwargs = {"api_url": fake.url, "sandbox_url": fake.url, "api_key": "e2b_fake"}
    if name == "image":
        kwargs = {"store": request.getfixturevalue("image_store")}
        spec_kw = {"image": request.getfixturevalue("test_image").containers_storage}
    provider = get_provider(name, **kwargs)
    spec = SandboxSpec(provider=name, files={"seed.txt": "seeded\n"}, **SPEC, **spec_kw)  # type: ignore[arg-type]
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
