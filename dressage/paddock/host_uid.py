"""A root worker's ``rlimit`` sandboxes run as a host uid of their own: drawing it, handing it the
workspace, and checking it can reach what bubblewrap binds.

The kernel exempts host root from ``RLIMIT_NPROC``, and a root worker's bubblewrap maps the sandbox
user back to root, so for the ``rlimit`` mechanism (:mod:`dressage.paddock.limits`) a root worker
starts bubblewrap as an unprivileged host uid drawn per sandbox: its process count is then that
sandbox's alone. That uid has no groups and owns the sandbox's workspace; what it binds from the
host (the workspace's folder, a root filesystem, the proxy socket) must be reachable by other users.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from dressage.errors import SandboxError

#: Host uids a root worker runs ``rlimit`` sandboxes as: one drawn per sandbox from this range
#: (first, count), far above ordinary and subordinate (``/etc/subuid``) ranges.
SANDBOX_HOST_UIDS = (1_500_000_000, 1 << 24)


def draw_host_uid() -> int:
    """A host uid for one ``rlimit`` sandbox of a root worker, drawn from :data:`SANDBOX_HOST_UIDS`."""
    first, count = SANDBOX_HOST_UIDS
    return first + secrets.randbelow(count)


def become(uid: int) -> None:
    """In a forked child before exec: drop every group and become host ``uid`` (from root)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def hand_over(root: Path, path: Path, uid: int) -> None:
    """Make ``path`` and its ancestors up to ``root`` (which root made for the sandbox) ``uid``'s."""
    for p in [path, *path.parents]:
        with contextlib.suppress(FileNotFoundError):
            if p.lstat().st_uid != uid:
                os.lchown(p, uid, uid)
        if p == root:
            return


def hand_over_tree(root: Path, uid: int) -> None:
    """Make every file and directory under ``root`` (and ``root``) ``uid``'s; links are not followed."""
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def check_reachable(path: str, what: str, uid: int) -> None:
    """Refuse, saying so, when host uid ``uid`` (no groups) cannot reach ``path``: every folder above
    it must be searchable by other users. Bubblewrap runs as that uid and binds ``path``."""
    for folder in Path(path).parents:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            raise SandboxError(
                f"the sandbox runs as host uid {uid} (rlimit limits for a root worker) and cannot reach "
                f"{what} {path}: {folder} is not searchable by other users (chmod o+x it, move {what}, "
                "or give the worker a cgroup)"
            )


def open_socket_to_others(sock: str) -> None:
    """Let another uid reach a host Unix socket: connect needs write on it, search on its folder.

    Used for the proxy socket of a sandbox running as its own uid. Anyone on the host could connect
    to the proxy's loopback port already; this opens no more than that.
    """
    os.chmod(sock, os.stat(sock).st_mode & 0o7777 | 0o006)
    parent = os.path.dirname(sock)
    os.chmod(parent, os.stat(parent).st_mode & 0o7777 | 0o001)
