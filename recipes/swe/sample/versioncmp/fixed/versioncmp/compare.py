"""Ordering of dotted version strings (``major.minor.patch``, any number of parts)."""


def _parts(version):
    return [int(p) for p in version.split(".")]


def compare(a, b):
    """-1 if version ``a`` is older than ``b``, 0 if they are the same version, 1 if newer.

    Parts compare as numbers, and a missing trailing part counts as 0 (``1.2`` is ``1.2.0``)."""
    pa, pb = _parts(a), _parts(b)
    width = max(len(pa), len(pb))
    pa += [0] * (width - len(pa))
    pb += [0] * (width - len(pb))
    if pa == pb:
        return 0
    return -1 if pa < pb else 1


def newest(versions):
    """The newest of ``versions`` (None for an empty list)."""
    best = None
    for v in versions:
        if best is None or compare(v, best) > 0:
            best = v
    return best
