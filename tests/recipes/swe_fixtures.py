"""The SWE recipe's test data: the sample's repositories built under a temporary folder, with the
committed records next to them, and the checkout cache there too."""

from __future__ import annotations

import shutil
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
