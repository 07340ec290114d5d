"""Compare dotted version strings."""

from versioncmp.compare import compare, newest

__all__ = ["compare", "newest"]
