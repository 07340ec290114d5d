"""The project stands alone (issue 26, point 8): nothing a clone holds points outside the clone.

Docs and docstrings used to cite a design document through the parent folder of the checkout, which a
clone does not have; what the project needs from it lives in docs/architecture.md ("The log's
rules"). The needles are assembled so that this file does not contain them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDLES = ("shared" + "/", "DESIGN" + ".md")


def _tracked_files() -> list[Path]:
    """The checkout's files: git's list when it is a git work tree, else every file but caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout
        return [REPO / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".venv-harbor", "__pycache__", ".dressage", ".mypy_cache", ".ruff_cache"}
        return [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.parts)]


def test_nothing_refers_outside_the_checkout() -> None:
    hits = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (images, wheels)
        for number, line in enumerate(text.splitlines(), 1):
            hits += [f"{path.relative_to(REPO)}:{number}: {line.strip()}" for n in NEEDLES if n in line]
    assert not hits, "\n".join(hits)


def test_the_rules_the_code_cites_are_in_the_project_docs() -> None:
    architecture = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "## The log's rules" in architecture
    for number in range(1, 9):
        assert f"\n{number}. **" in architecture, f"rule {number} is missing from docs/architecture.md"
