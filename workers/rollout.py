"""`dressage-worker rollout` (not built yet)."""

from __future__ import annotations

from dressage.errors import NotSupportedError


def rollout_command() -> None:
    """Not built yet."""
    raise NotSupportedError("dressage-worker rollout is not built yet")
