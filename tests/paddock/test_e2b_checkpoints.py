"""E2B checkpoints against the local fake at E2B's wire protocol (tests/paddock/fake_e2b.py): a
checkpoint is a snapshot taken through the SDK's ``create_snapshot``, a restore starts a VM from it
(``AsyncSandbox.create`` with the snapshot as template) in place of the fresh one, and
``delete_snapshot`` removes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.paddock import SandboxSpec
from dressage.paddock.checkpoints import Checkpointer, CheckpointError, Entry, Manifest
from dressage.paddock.e2b import E2BProvider, E2BSandbox, delete_checkpoint
from dressage.store.artifacts import LocalBlobStore

pytestmark = pytest.mark.anyio

SPEC = SandboxSpec(provider="e2b", timeout_s=10, env={"MINE": "1"}, network=False)


async def test_snapshot_checkpoint_restored_into_a_fresh_sandbox(fake_e2b, tmp_path: Path) -> None:
    provider = E2BProvider(api_url=fake_e2b.url, sandbox_url=fake_e2b.url, api_key="e2b_fake")
    blobs = LocalBlobStore(tmp_path / "blobs")
    checkpointer = Checkpointer(blobs)
    async with await provider.create("e2b-a", SPEC) as first:
        assert (await first.exec("mkdir -p src && printf 'x=1\\n' > src/a.py && ln -s src/a.py link")).ok
        manifest = await first.checkpoint(checkpointer)
        await first.write_file("later.txt", "after the checkpoint")
        assert (await first.exec("rm src/a.py")).ok
    (entry,) = manifest.entries
    assert (entry.kind, manifest.roots) == ("snapshot", ("vm",))
    assert entry.target in fake_e2b.state.snapshots
    assert checkpointer.last_stats.hashed_bytes == 0 and manifest.files == 0

    fresh_spec = SandboxSpec(**{**SPEC.__dict__, "files": {"seed.txt": "x"}})
    async with await provider.create("e2b-b", fresh_spec) as fresh:
        assert isinstance(fresh, E2BSandbox)
        replaced = fresh.sbx.sandbox_id
        await fresh.restore_checkpoint(manifest, blobs)
        assert fresh.sbx.sandbox_id != replaced and replaced not in fake_e2b.state.roots  # killed
        created = fake_e2b.state.created[-1]
        assert created["templateID"] == entry.target  # started from the snapshot
        assert (created["envVars"], created["allow_internet_access"]) == ({"MINE": "1"}, False)
        assert await fresh.read_file("src/a.py") == b"x=1\n"
        r = await fresh.exec("readlink link; ls")
        assert r.stdout == "src/a.py\nlink\nsrc\n", r  # no later.txt, no seed.txt
    assert await delete_checkpoint(provider, manifest) is True
    assert entry.target not in fake_e2b.state.snapshots
    assert await delete_checkpoint(provider, manifest) is False


async def test_a_file_checkpoint_is_refused_on_e2b(fake_e2b, tmp_path: Path) -> None:
    provider = E2BProvider(api_url=fake_e2b.url, sandbox_url=fake_e2b.url, api_key="e2b_fake")
    files = Manifest(("workspace",), (Entry("workspace", "dir", 0o755),))
    async with await provider.create("e2b-c", SPEC) as sb:
        with pytest.raises(CheckpointError, match="not an E2B snapshot"):
            await sb.restore_checkpoint(files, LocalBlobStore(tmp_path / "blobs"))
