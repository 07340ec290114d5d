"""Apply a checkpoint's overlay changes inside a fresh image sandbox (run there, standard library only).

Started by :mod:`dressage.paddock.image` with the host's python3 in a bubblewrap over the new
sandbox's own overlay, as the sandbox's user: ``python3 -I -S THIS PLAN``. ``PLAN`` is a JSON list
of the checkpoint's overlay entries in path order (``path`` absolute inside, ``kind``, ``mode``,
``blob``: the staged file of a ``file``, ``target``: a link's). Every change goes through the
mounted overlay, so the kernel writes its own whiteouts and opaque folders:

1. ``deleted`` and ``opaque_dir`` paths are removed (a whiteout hides the image's entry);
2. folders are made or changed (``chmod`` copies an image folder up), files are created from their
   staged bytes, links are made, each replacing what the path held;
3. folder modes are set last, deepest first (a read-only folder would refuse its children).
"""

import json
import os
import shutil
import stat
import sys


def _writable_parent(path: str) -> None:
    """Let the sandbox's user change ``path``'s folder (its recorded mode is set again at the end)."""
    parent = os.path.dirname(path) or "/"
    if not os.access(parent, os.W_OK | os.X_OK):
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | 0o700)


def _remove(path: str) -> None:
    """Remove ``path`` (a folder with all it holds), if it is there; through the overlay: a whiteout."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    _writable_parent(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    try:
        shutil.rmtree(path)
    except PermissionError:  # a read-only folder inside refuses its children's removal
        for dirpath, _, _ in os.walk(path):
            os.chmod(dirpath, 0o700)
        shutil.rmtree(path)


def _make(entry: dict) -> None:
    """Make one folder, file or link of the plan, replacing what ``path`` holds."""
    path, kind, mode = entry["path"], entry["kind"], entry["mode"]
    if kind in ("dir", "opaque_dir"):
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, mode | 0o700)
        else:
            _remove(path)
            os.mkdir(path, mode | 0o700)
        return
    _remove(path)
    if kind == "symlink":
        os.symlink(entry["target"], path)
        return
    with open(entry["blob"], "rb") as src:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.chmod(path, mode)


def main(plan_path: str) -> None:
    """Apply the plan at ``plan_path`` (the module docstring's three passes)."""
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    for entry in plan:
        if entry["kind"] in ("deleted", "opaque_dir"):
            _remove(entry["path"])
    for entry in plan:
        if entry["kind"] != "deleted":
            _make(entry)
    for entry in reversed(plan):
        if entry["kind"] in ("dir", "opaque_dir"):
            os.chmod(entry["path"], entry["mode"])


if __name__ == "__main__":
    main(sys.argv[1])
