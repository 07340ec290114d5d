"""Where two run configs differ, as dotted field paths (``rollout.sampling.max_tokens``).

A run's config is frozen when it is created; a second writer that brings another config is refused,
and the refusal names the fields that differ rather than two hashes nobody can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def differing_fields(old: Mapping[str, Any], new: Mapping[str, Any], *, prefix: str = "") -> list[str]:
    """Dotted paths where ``old`` and ``new`` differ (a key present on one side only counts), sorted;
    nested mappings are compared key by key, anything else as a whole."""
    out: list[str] = []
    for key in sorted(set(old) | set(new), key=str):
        path = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += differing_fields(a, b, prefix=f"{path}.")
        elif key not in old or key not in new or a != b:
            out.append(path)
    return out


def describe_difference(old: Mapping[str, Any], new: Mapping[str, Any], *, limit: int = 5) -> str:
    """``a.b, c, ... and N more``: the first ``limit`` differing fields."""
    fields = differing_fields(old, new)
    if not fields:
        return "no field (the configs are equal once normalised)"
    return ", ".join(fields[:limit]) + (f" and {len(fields) - limit} more" if len(fields) > limit else "")
