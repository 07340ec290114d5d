"""The environment is read in one place: dressage/config.py (Settings). No other module of the
package or of the workers touches ``os.environ`` / ``os.getenv``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {REPO / "dressage" / "config.py"}


def _environment_reads(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv", "environb") for a in node.names):
                lines.append(node.lineno)
    return lines


def test_only_the_settings_module_reads_the_environment() -> None:
    files = [
        *(REPO / "dressage").rglob("*.py"),
        *(REPO / "workers").rglob("*.py"),
        *(REPO / "recipes").rglob("*.py"),
    ]
    found = {
        f"{p.relative_to(REPO)}:{line}" for p in files if p not in ALLOWED for line in _environment_reads(p)
    }
    assert found == set()
