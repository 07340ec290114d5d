"""The SWE recipe's test data: the sample's repositories built under a temporary folder, with the
committed records next to them, and the checkout cache there too."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from recipes.swe.make_sample import DATA, RECORDS, build_repos


def swe_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with ``swe_sample.jsonl`` (the shipped records) and ``repos/`` (built); returns the
    records file's path. ``DRESSAGE_CACHE_DIR`` points into ``tmp_path``: checkouts are the test's own."""
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    build_repos(data / "repos")
    shutil.copy(DATA / RECORDS, data / RECORDS)
    return data / RECORDS


def sandbox_pytest_missing() -> str | None:
    """Why the bubblewrap sandboxes' python (the host's ``/usr/bin/python3``) cannot run the sample's
    tests, or None."""
    done = subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True, check=False)
    return None if done.returncode == 0 else "/usr/bin/python3 has no pytest: run scripts/setup-swe.sh"


requires_sandbox_pytest = pytest.mark.skipif(
    sandbox_pytest_missing() is not None, reason=str(sandbox_pytest_missing())
)
"""Marks the tests whose sandboxes run the sample's tests (a skip fails under DRESSAGE_REQUIRE_ALL=1)."""
