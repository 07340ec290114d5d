"""The ``swe`` extra: the SWE-bench package (``swebench``, with ``unidiff``), imported on first use.

A missing extra is a one-line :class:`~dressage.errors.ConfigError` that names it, never an
``ImportError`` from deep inside a reward.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dressage.errors import ConfigError

INSTALL = "pip install 'dressage[swe]'"


def need(module: str) -> ModuleType:
    """Import ``module`` of the ``swe`` extra, or say which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"the SWE recipe needs the 'swe' extra (SWE-bench's package, for {module}): {INSTALL} ({e})"
        ) from None
