"""`dressage-worker proxy` (not built yet)."""

from __future__ import annotations

from dressage.errors import NotSupportedError


def proxy_command() -> None:
    """Not built yet."""
    raise NotSupportedError("dressage-worker proxy is not built yet")
