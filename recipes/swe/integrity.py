"""The integrity check: a run that edited the tests or the grading files scores 0 and says why.

The grader restores and re-applies the test files of ``test_patch`` itself (as SWE-bench does),
but an agent can still change what the tests see: other test files, ``conftest.py``, the test
runner's configuration, a ``sitecustomize.py``. Rather than grade around such edits, a run whose
change touches one is not graded at all: reward 0, with the paths in the reward's details. Changes
to files the blackbox agents' adapters write (their config under ``.dressage/`` and friends) are
left out of the agent's patch before this check (:data:`ADAPTER_FILES`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from recipes.swe.records import SweRecord, patch_paths

GRADING_FILES: tuple[str, ...] = (
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "noxfile.py",
    "sitecustomize.py",
    "usercustomize.py",
    "*.pth",
)
"""Base names that control how tests are collected or run: protected where they are, and created."""

TEST_FILES: tuple[str, ...] = ("test_*.py", "*_test.py", "tests/*", "*/tests/*", "testing/*", "*/testing/*")
"""Paths of existing test files: protected when modified, deleted or renamed (new ones are allowed:
an agent may write its own reproduction test)."""

ADAPTER_FILES: tuple[str, ...] = (
    ".dressage",
    "opencode.json",
    ".openclaw",
    ".claude",
    ".claude.json",
    ".codex",
    ".config",
    ".cache",
    ".local",
    ".npm",
)
"""Top-level paths the agent adapters (and the CLIs' home) write into the workspace, never part of a fix."""


def _matches(path: str, globs: Iterable[str]) -> bool:
    base = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(base, g) for g in globs)


def violations(
    changes: Sequence[tuple[str, str]],
    record: SweRecord,
    grading_files: Sequence[str] = GRADING_FILES,
    test_files: Sequence[str] = TEST_FILES,
) -> list[str]:
    """The agent's changes (``(status, path)`` from ``git diff --name-status``: ``A``, ``M``, ``D``...)
    that break integrity, each as ``"<status> <path>: <why>"`` (empty: the run may be graded)."""
    graded = set(patch_paths(record.test_patch))
    out: list[str] = []
    for status, path in changes:
        if path in graded:
            out.append(f"{status} {path}: a file of the test patch")
        elif _matches(path, grading_files):
            out.append(f"{status} {path}: a file that controls how the tests run")
        elif status != "A" and _matches(path, test_files):
            out.append(f"{status} {path}: an existing test file")
    return out


def parse_name_status(text: str) -> list[tuple[str, str]]:
    """``git diff --name-status -z --no-renames`` output as ``(status, path)`` pairs."""
    parts = [p for p in text.split("\0") if p]
    return [(parts[i][:1], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
