"""``dataset.loader`` functions for tests/rollout/test_dataset_loader.py (imported by dotted path)."""

from __future__ import annotations

from pathlib import Path

from dressage.agents import Task
from dressage.errors import ConfigError


def lines(path: Path, limit: int | None) -> list[Task]:
    """One task per line of a text file; ignores ``limit`` (the reader applies it)."""
    text = Path(path).read_text(encoding="utf-8")
    return [Task(index=i, prompt=line, label=line.upper()) for i, line in enumerate(text.split())]


def not_a_list(path: Path, limit: int | None) -> object:
    return {"prompt": "x"}


def misnumbered(path: Path, limit: int | None) -> list[Task]:
    return [Task(index=1, prompt="a")]


def nothing(path: Path, limit: int | None) -> list[Task]:
    return []


def unstorable(path: Path, limit: int | None) -> list[Task]:
    return [Task(index=0, id="t0", prompt="a\x00b")]


def refuses(path: Path, limit: int | None) -> list[Task]:
    raise ConfigError(f"{path}: record 3: question: missing")


NOT_CALLABLE = 42
