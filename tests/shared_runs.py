"""Expensive, read-mostly test set-ups made once per test run instead of once per xdist worker.

pytest-xdist builds a session- or module-scoped fixture in every worker that runs one of its tests
(and ``--dist loadgroup`` cannot keep them on one worker here: docs/test-speed.md). A fixture whose
set-up is a long run of real commands (the README quickstart, a recipe's README commands) shares it
instead: the first worker to need it builds it in the run's shared temporary directory while holding
a file lock; the others wait on the lock and use what it built.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def run_root(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory every process of this test run shares: the base temporary directory,
    or under xdist its parent (each worker's base is a folder of the run's)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if hasattr(config, "workerinput") else root


def shared_folder(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``root/name``, built by ``build`` (given the empty folder) once for every process sharing
    ``root``. A build that raised is not kept: the next process to ask builds it again from an empty
    folder (and fails with its own message if the fault is real)."""
    folder, built = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if built.is_file():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        build(folder)
        built.touch()
        return folder
