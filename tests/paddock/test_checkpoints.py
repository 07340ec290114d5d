"""Sandbox checkpoints on real bubblewrap sandboxes: what a session's commands left in its workspace
(files, modes, links, empty folders) is captured and restored into a fresh sandbox, whose commands
see it byte for byte; ``/tmp`` dies with each command, so it is no part of a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from dressage.errors import SandboxError
from dressage.paddock import SandboxSpec
from dressage.paddock.bwrap import BwrapProvider
from dressage.paddock.checkpoints import Checkpointer, restore
from dressage.store.artifacts import LocalBlobStore
from tests.paddock.conftest import requires_bwrap

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
