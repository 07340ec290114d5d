"""Fixtures: a second dev engine for pools and weight updates (the main one is the session's
``engine`` of tests/conftest.py), and torch on one thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ENGINE_EXTRA, require_module

torch = require_module("torch", ENGINE_EXTRA)
require_module("transformers", ENGINE_EXTRA)

from tests.dev_engine import RunningEngine, serve_tiny_engine  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def engine_b() -> Iterator[RunningEngine]:
    """A second dev engine, for pools and weight updates."""
    yield from serve_tiny_engine(seed=0)
