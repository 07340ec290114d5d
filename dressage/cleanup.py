"""Shutdown steps that must not mask the error being handled, yet leave a trace.

``with logged_failures(log, "stopping the proxy"):`` runs a cleanup step; an ``Exception`` it raises
is logged as a warning (message, exception type and traceback at debug level) and not re-raised, so
the original error of a failed run still reaches the user, and the failed cleanup is on record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def logged_failures(log: logging.Logger, step: str) -> Iterator[None]:
    """Run a cleanup ``step``; log (do not raise) any ``Exception`` it raises."""
    try:
        yield
    except Exception as e:
        log.warning("%s failed: %s: %s", step, type(e).__name__, e)
        log.debug("%s failed", step, exc_info=True)
