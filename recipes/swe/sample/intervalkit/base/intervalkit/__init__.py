"""Helpers for closed intervals given as (start, end) tuples."""

from intervalkit.core import covers, merge

__all__ = ["covers", "merge"]
