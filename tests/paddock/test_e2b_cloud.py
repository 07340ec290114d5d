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


async def test_real_e2b_runs_a_harbor_task_verifier() -> None:
    """A Harbor task's paths laid out in a real VM (symlinks created as root), its test.sh run as
    E2B's user, its reward read back: the same code path as against the fake."""
    from dressage.agents.base import AgentResult
    from dressage.harbor.sandbox import task_spec
    from dressage.harbor.verifier import verify
    from dressage.rollout.datasets import load_tasks
    from dressage.rollout.rewards import HarborRewardConfig, RewardInput
    from tests.harbor.conftest import DATASETS

    task = next(t for t in load_tasks(DATASETS / "basic", provider="e2b") if t.id == "pass")
    spec = task_spec(SandboxSpec(provider="e2b", timeout_s=30), task)
    async with await get_provider("e2b").create("cloud-harbor", spec) as sb:
        assert (await sb.exec("ls -A /tests")).stdout == ""  # hidden until the verifier runs
        assert (await sb.exec("echo hello > greeting.txt && pwd")).stdout == "/app\n"
        out = await verify(HarborRewardConfig(), RewardInput(task, "", AgentResult(answer=""), sb))
        assert out.reward == 1.0 and out.details["source"] == "reward.txt"


async def test_real_e2b_checkpoint_is_a_snapshot_restored_into_a_fresh_vm(tmp_path) -> None:
    """create_snapshot at a checkpoint, a fresh VM started from it sees the files of that moment (not
    later ones), and delete_snapshot removes it."""
    from dressage.paddock.checkpoints import Checkpointer
    from dressage.paddock.e2b import E2BProvider, delete_checkpoint
    from dressage.store.artifacts import LocalBlobStore

    provider = E2BProvider()
    blobs = LocalBlobStore(tmp_path / "blobs")
    spec = SandboxSpec(provider="e2b", timeout_s=30)
    async with await provider.create("cloud-ckpt-a", spec) as first:
        assert (await first.exec("echo kept > kept.txt && echo etc | sudo tee /etc/ckpt >/dev/null")).ok
        manifest = await first.checkpoint(Checkpointer(blobs))
        await first.write_file("later.txt", "after")
    try:
        async with await provider.create("cloud-ckpt-b", spec) as fresh:
            await fresh.restore_checkpoint(manifest, blobs)
            r = await fresh.exec("cat kept.txt /etc/ckpt; test -e later.txt || echo no-later")
            assert r.stdout == "kept\netc\nno-later\n", r
    finally:
        assert await delete_checkpoint(provider, manifest)
