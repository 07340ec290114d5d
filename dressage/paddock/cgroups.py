"""Per-sandbox cgroups: the limit that actually contains a fork bomb and a memory hog.

``RLIMIT_NPROC`` does not hold for a host root user (the kernel exempts it, and bubblewrap's user
namespace maps the sandbox user back to root), so the ``pids`` controller is the process limit, and
the ``memory`` controller the memory limit. Both cgroup v2 (unified) and v1 (one hierarchy per
controller, as on this project's CI machines) are handled. Each sandbox gets a cgroup next to the
worker's own; each ``exec`` gets a child of it, so a timed-out command can be signalled without
touching its siblings, and terminate can kill every process the sandbox ever started.

When no writable cgroup hierarchy exists, :func:`create_sandbox_cgroup` says why; the bwrap provider
then refuses the sandbox, or uses rlimits where the run's ``sandbox.limits`` accepts them (see
:mod:`dressage.paddock.limits`). Where the hierarchies live is the ``cgroup_root`` setting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from dressage.config import load_settings
from dressage.errors import SandboxUnavailableError


def _own_paths() -> dict[str, str]:
    """Controller (or ``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


@dataclass
class Cgroup:
    """A cgroup that may span several v1 hierarchies (one directory per controller)."""

    dirs: list[Path] = field(default_factory=list)
    version: int = 2

    def child(self, name: str) -> Cgroup:
        """Create (or reuse) a child cgroup in every hierarchy."""
        dirs = []
        for d in self.dirs:
            c = d / name
            c.mkdir(exist_ok=True)
            dirs.append(c)
        return Cgroup(dirs, self.version)

    def enter_fn(self) -> list[str]:
        """The ``cgroup.procs`` files a forked child writes ``0`` into to join this cgroup."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        """Host pids of every process in this cgroup and its descendants."""
        found: set[int] = set()
        for d in self.dirs:
            for group in [d, *_subgroups(d)]:
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(x) for x in (group / "cgroup.procs").read_text().split())
        return found

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process in the cgroup tree (``cgroup.kill`` where v2 offers it)."""
        if sig == signal.SIGKILL and self.version == 2 and self.dirs:
            kf = self.dirs[0] / "cgroup.kill"
            if kf.exists():
                with contextlib.suppress(OSError):
                    kf.write_text("1")
        # A fork bomb may spawn between reading and signalling; repeat until empty (bounded).
        for _ in range(50 if sig == signal.SIGKILL else 1):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            if sig != signal.SIGKILL:
                return
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and delete the cgroup directories (children first)."""
        self.kill(signal.SIGKILL)
        for d in self.dirs:
            for p in [*_subgroups(d), d]:
                for _ in range(20):
                    try:
                        p.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)


def _subgroups(d: Path) -> list[Path]:
    """The child cgroups below ``d``, deepest first.

    An exec's child group may be removed while this walks (its own cleanup runs concurrently);
    ``os.walk`` skips directories that vanish, where ``Path.rglob`` raises.
    """
    return [Path(root) / name for root, names, _ in os.walk(d, topdown=False) for name in names]


def join_cgroup(procs_files: list[str]) -> None:
    """Move the calling process into a cgroup (runs in the forked child before exec)."""
    for f in procs_files:
        fd = os.open(f, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def create_sandbox_cgroup(name: str, max_processes: int | None, memory_mb: int | None) -> Cgroup:
    """Make a cgroup with ``pids.max`` and a memory limit under the ``cgroup_root`` setting.

    Raises :class:`SandboxUnavailableError` saying why none can be made (no hierarchy, a controller
    not delegated, no permission, a read-only mount), so the caller can refuse or, where the run's
    config accepts it, fall back to rlimits (see :mod:`dressage.paddock.bwrap`).
    """
    root = load_settings().cgroup_root
    try:
        if (root / "cgroup.controllers").exists():
            return _create_v2(root, name, max_processes, memory_mb)
        return _create_v1(root, name, max_processes, memory_mb)
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        raise SandboxUnavailableError(f"{e.strerror or e}{where}") from e


def _create_v1(root: Path, name: str, max_processes: int | None, memory_mb: int | None) -> Cgroup:
    own = _own_paths()
    dirs: list[Path] = []
    try:
        for ctrl, limit_file, value in (
            ("pids", "pids.max", max_processes),
            ("memory", "memory.limit_in_bytes", None if memory_mb is None else memory_mb * 1024 * 1024),
        ):
            base = root / ctrl / own.get(ctrl, "/").lstrip("/")
            if not base.is_dir():
                raise OSError(0, f"no cgroup v1 {ctrl} hierarchy (nor cgroup v2)", str(base))
            d = base / name
            d.mkdir(exist_ok=True)
            dirs.append(d)
            if value is not None:
                (d / limit_file).write_text(str(value))
                if ctrl == "memory":
                    with contextlib.suppress(OSError):  # no swap accounting on some kernels
                        (d / "memory.memsw.limit_in_bytes").write_text(str(value))
    except OSError:
        Cgroup(dirs, 1).remove()
        raise
    return Cgroup(dirs, 1)


def _create_v2(root: Path, name: str, max_processes: int | None, memory_mb: int | None) -> Cgroup:
    base = root / _own_paths().get("", "/").lstrip("/")
    offered = (base / "cgroup.controllers").read_text().split()
    enabled = (base / "cgroup.subtree_control").read_text().split()
    for ctrl in ("pids", "memory"):
        if ctrl not in offered:
            raise OSError(
                0, f"cgroup v2 does not offer the {ctrl} controller here (not delegated)", str(base)
            )
        if ctrl not in enabled:
            # Fails with EBUSY when the worker's cgroup holds processes (the "no internal
            # processes" rule); run the worker in a delegated cgroup (systemd Delegate=yes).
            (base / "cgroup.subtree_control").write_text(f"+{ctrl}")
    d = base / name
    d.mkdir(exist_ok=True)
    cg = Cgroup([d], 2)
    try:
        if max_processes is not None:
            (d / "pids.max").write_text(str(max_processes))
        if memory_mb is not None:
            (d / "memory.max").write_text(str(memory_mb * 1024 * 1024))
            with contextlib.suppress(OSError):
                (d / "memory.swap.max").write_text("0")
        # Children of d need the controllers too, for per-exec sub-cgroups.
        (d / "cgroup.subtree_control").write_text("+pids +memory")
    except OSError:
        cg.remove()
        raise
    return cg
