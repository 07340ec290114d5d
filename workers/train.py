"""`dressage-worker train` (not built yet)."""

from __future__ import annotations

from dressage.errors import NotSupportedError


def train_command() -> None:
    """Not built yet."""
    raise NotSupportedError("dressage-worker train is not built yet")
