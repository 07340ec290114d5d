"""Fixtures of the Harbor tests: the fixture datasets, and the rollout suite's engine and databases."""

from __future__ import annotations

from pathlib import Path

from dressage.harbor.kind import register
from tests.rollout.conftest import any_db_url, anyio_backend, engine_url, rollout_pg_url

register()  # as the program's top does (workers/__init__.py): these tests load Harbor datasets directly

DATASETS = Path(__file__).resolve().parent / "datasets"
REPO = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
"""The optional Python 3.12 environment with Harbor (``scripts/setup-harbor.sh``)."""

__all__ = ["DATASETS", "HARBOR_PYTHON", "any_db_url", "anyio_backend", "engine_url", "rollout_pg_url"]

collect_ignore_glob = ["datasets/*"]  # the fixture tasks' own tests run inside their sandboxes only
