"""Sandbox checkpoints on real bubblewrap sandboxes: what a session's commands left in its workspace
(files, modes, links, empty folders) is captured and restored into a fresh sandbox, whose commands
see it byte for byte; ``/tmp`` dies with each command, so it is no part of a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.errors import SandboxError
from dressage.paddock import SandboxSpec
from dressage.paddock.bwrap import BwrapProvider
from dressage.paddock.checkpoints import Checkpointer, CheckpointError, restore
from dressage.paddock.image import ImageProvider, ImageSandbox
from dressage.paddock.image_store import ImageStore
from dressage.store.artifacts import LocalBlobStore
from tests.paddock.conftest import SPEC as IMAGE_SPEC
from tests.paddock.conftest import requires_bwrap
from tests.paddock.images import BuiltImage

pytestmark = [requires_bwrap, pytest.mark.anyio]

SPEC = SandboxSpec(memory_mb=None, max_processes=None, limits=("cgroup", "rlimit", "none"))
WORK = (
    "mkdir -p src empty && printf 'x=1\\n' > src/a.py && printf '#!/bin/sh\\necho ran\\n' > run.sh && "
    "chmod 755 run.sh && chmod 700 empty && ln -s src/a.py link && head -c 4096 /dev/urandom > blob && "
    "echo gone > /tmp/t"
)
SHOW = "sha256sum src/a.py run.sh blob link && stat -c '%n %a' run.sh empty && readlink link && ./run.sh"


async def test_restored_sandbox_sees_the_checkpoint(tmp_path: Path) -> None:
    provider = BwrapProvider(root_dir=tmp_path / "sandboxes")
    blobs = LocalBlobStore(tmp_path / "blobs")
    try:
        async with await provider.create("ck-a", SPEC) as first:
            assert (await first.exec(WORK)).ok
            manifest = Checkpointer(blobs).capture(first.writable_roots())
            before = await first.exec(SHOW)
            assert before.ok, before.stderr
        async with await provider.create(
            "ck-b", SandboxSpec(**{**SPEC.__dict__, "files": {"seed.txt": "x"}})
        ) as fresh:
            restore(manifest, fresh.writable_roots(), blobs)
            fresh.restored()
            after = await fresh.exec(SHOW)
            assert after.ok, after.stderr
            assert after.stdout == before.stdout
            assert (await fresh.exec("ls seed.txt /tmp/t")).exit_code != 0  # seeded file replaced; no /tmp
            assert Checkpointer(blobs).capture(fresh.writable_roots()).sha256 == manifest.sha256
    except SandboxError as e:
        pytest.fail(f"bubblewrap sandbox failed: {e}")


IMAGE_WORK = (
    "printf 'ws\\n' > ws.txt && mkdir -p /etc/dressage && printf 'conf\\n' > /etc/dressage/new.conf && "
    "head -c 3000 /dev/urandom > /opt/added.bin && chmod 640 /opt/added.bin && ln -s added.bin /opt/link && "
    "rm /opt/lower.txt && chmod 700 /usr/bin/sed && rm -rf /usr/lib/python3.11/json && "
    "mkdir /usr/lib/python3.11/json && printf 'z\\n' > /usr/lib/python3.11/json/z.txt && chmod 555 /etc/dressage"
)
IMAGE_SHOW = (
    "sha256sum ws.txt /etc/dressage/new.conf /opt/added.bin /usr/bin/sed && readlink /opt/link && "
    "stat -c '%n %a' /opt/added.bin /usr/bin/sed /etc/dressage && ls -A /opt /usr/lib/python3.11/json && "
    "test ! -e /opt/lower.txt && echo lower-gone"
)


@pytest.mark.slow
async def test_image_sandbox_restores_workspace_and_overlay(
    tmp_path: Path, test_image: BuiltImage, image_store: ImageStore
) -> None:
    """Files written into the workspace and into the image's /etc and /opt, an image file deleted, an
    image folder made anew, a mode changed: all seen byte for byte in a fresh image sandbox."""
    provider = ImageProvider(root_dir=tmp_path / "sandboxes", store=image_store)
    blobs = LocalBlobStore(tmp_path / "blobs")
    spec = SandboxSpec(provider="image", image=test_image.oci, **IMAGE_SPEC)  # type: ignore[arg-type]
    async with await provider.create("img-a", spec) as first:
        assert (await first.exec(IMAGE_WORK)).ok
        manifest = await first.checkpoint(Checkpointer(blobs))
        before = await first.exec(IMAGE_SHOW)
        assert before.ok and before.stdout.endswith("lower-gone\n"), before
    kinds = {e.path: e.kind for e in manifest.entries}
    assert kinds["image"] == "overlay" and manifest.by_path()["image"].target == first.image.digest
    assert kinds["image/opt/lower.txt"] == "deleted"
    assert kinds["image/usr/lib/python3.11/json"] == "opaque_dir"
    assert kinds["image/etc/dressage/new.conf"] == kinds["workspace/ws.txt"] == "file"
    with pytest.raises(CheckpointError, match="applied by their sandbox"):
        restore(manifest, {"workspace": tmp_path, "image": tmp_path}, blobs)

    fresh_spec = SandboxSpec(**{**spec.__dict__, "files": {"seed.txt": "x"}})
    async with await provider.create("img-b", fresh_spec) as fresh:
        await fresh.restore_checkpoint(manifest, blobs)
        after = await fresh.exec(IMAGE_SHOW)
        assert after.ok, after.stderr
        assert after.stdout == before.stdout
        assert (await fresh.exec("ls seed.txt")).exit_code != 0  # the seeded workspace is replaced
        assert (await fresh.checkpoint(Checkpointer(blobs))).sha256 == manifest.sha256
        assert isinstance(fresh, ImageSandbox) and (fresh.image.rootfs / "opt/lower.txt").exists()
    other = SandboxSpec(**{**spec.__dict__, "image": test_image.other})
    async with await provider.create("img-c", other) as elsewhere:
        with pytest.raises(CheckpointError, match="lies over image"):
            await elsewhere.restore_checkpoint(manifest, blobs)
