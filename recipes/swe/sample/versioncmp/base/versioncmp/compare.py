"""Ordering of dotted version strings (``major.minor.patch``, any number of parts)."""


def compare(a, b):
    """-1 if version ``a`` is older than ``b``, 0 if they are the same version, 1 if newer."""
    if a == b:
        return 0
    return -1 if a < b else 1


def newest(versions):
    """The newest of ``versions`` (None for an empty list)."""
    best = None
    for v in versions:
        if best is None or compare(v, best) > 0:
            best = v
    return best
