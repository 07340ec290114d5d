"""The Harbor tests' fixture datasets (their engine and databases are tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

from dressage.harbor.kind import register

register()  # as the program's top does (workers/__init__.py): these tests load Harbor datasets directly

DATASETS = Path(__file__).resolve().parent / "datasets"
REPO = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
"""The optional Python 3.12 environment with Harbor (``scripts/setup-harbor.sh``)."""

__all__ = ["DATASETS", "HARBOR_PYTHON"]

collect_ignore_glob = ["datasets/*"]  # the fixture tasks' own tests run inside their sandboxes only
