"""Cached Debian and Ubuntu root filesystems for Harbor tasks whose Dockerfile is on the whitelist.

A :class:`~dressage.harbor.dockerfile.RootfsPlan` (base, release, packages, copies, env, workdir) names a
directory ``<cache>/harbor-rootfs/<sha256 of the plan and the copied files>``. :func:`build_rootfs`
makes it with ``mmdebstrap`` (Debian's unprivileged bootstrapper, ``--mode=unshare``: no root, no
container runtime) from the base's own archive (Debian's, or Ubuntu's ``archive.ubuntu.com`` with
Ubuntu's keyring: :mod:`dressage.harbor.distro`), copies the ``COPY`` sources in, and creates the mount points the sandbox binds
(``/workspace``, the workdir, ``/tests``, ``/logs``, ``/solution``, ``/run``, ``/tmp``), then renames
it into place atomically. Building needs the distribution's archive, so it happens in setup
(``python -m dressage.harbor.rootfs DATASET``, run by ``scripts/setup-harbor.sh``), never while an
episode runs: an episode whose root filesystem is not in the cache fails with a message saying how
to build it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dressage.config import load_settings
from dressage.errors import ConfigError, SandboxError
from dressage.harbor.distro import mmdebstrap_args, require_archive
from dressage.harbor.dockerfile import rootfs_key, rootfs_plan

MOUNT_POINTS = ("workspace", "tests", "logs", "solution", "run", "tmp", "proc", "dev")


def rootfs_cache_dir() -> Path:
    """``<cache_dir>/harbor-rootfs`` (``DRESSAGE_CACHE_DIR``, default ``~/.cache/dressage``)."""
    base = load_settings().cache_dir or Path.home() / ".cache" / "dressage"
    return Path(base) / "harbor-rootfs"


def cached_rootfs(plan: dict[str, Any], cache: Path | None = None) -> Path:
    """The built root filesystem of ``plan`` (its ``key``, or one computed from its ``context``);
    :class:`SandboxError` with the build command if absent."""
    path = (cache or rootfs_cache_dir()) / str(plan.get("key") or rootfs_key(plan))
    if not (path / "usr").is_dir():
        raise SandboxError(
            f"the {plan['base']} root filesystem of this task's Dockerfile is not built ({path}); build it "
            "(needs its distribution's archive) with: python -m dressage.harbor.rootfs DATASET_DIR"
        )
    return path


def build_rootfs(plan: dict[str, Any], cache: Path | None = None, *, mirror: str | None = None) -> Path:
    """Build (or find) the root filesystem of ``plan`` with ``mmdebstrap`` from its base's archive
    (``mirror``: another one); returns its directory."""
    cache = cache or rootfs_cache_dir()
    target = cache / rootfs_key(plan)
    if (target / "usr").is_dir():
        return target
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ConfigError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    root = work / "root"
    packages = ",".join(["bash", "coreutils", "tar", *plan["packages"]])
    distro = str(plan["base"]).partition(":")[0]
    args = [str(root) if a == "{target}" else a for a in mmdebstrap_args(distro, plan["suite"], mirror)]
    cmd = [exe, "--mode=unshare", "--variant=apt", "--format=directory", f"--include={packages}"]
    cmd += ["--skip=output/dev", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ConfigError(f"mmdebstrap failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        context = Path(plan["context"])
        for src, dst in plan["copies"]:
            dest = root / dst.lstrip("/")
            source = context / src
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
            else:
                if dst.endswith("/"):
                    dest = dest / source.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)
        for d in (*MOUNT_POINTS, str(plan.get("workdir") or "/app").lstrip("/")):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "etc" / "passwd").touch()
        (root / "etc" / "group").touch()
        root.chmod(0o755)
        root.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m dressage.harbor.rootfs DATASET...``: build the root filesystems a dataset needs."""
    from dressage.harbor.dockerfile import parse_dockerfile
    from dressage.harbor.tasks import load_task, task_dirs

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m dressage.harbor.rootfs DATASET_DIR...", file=sys.stderr)
        return 2
    for ds in args:
        for i, d in enumerate(task_dirs(ds)):
            try:
                task = load_task(d, i)
            except ConfigError as e:
                print(f"skipped: {e}", file=sys.stderr)
                continue
            if task.metadata["harbor"]["rootfs"]:
                env_dir = d / "environment"
                plan = parse_dockerfile(str(task.id), (env_dir / "Dockerfile").read_text(encoding="utf-8"))
                full = rootfs_plan(plan, env_dir)
                if not (rootfs_cache_dir() / rootfs_key(full) / "usr").is_dir():
                    where = f"task {task.id}: Dockerfile line {plan.base_line}"
                    require_archive(where, plan.base, plan.distro, plan.suite)
                print(f"{task.id}: {build_rootfs(full)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
