"""The optional extra a recipe's library comes from: a missing one is named in one line."""

from __future__ import annotations

import importlib
from types import ModuleType

from dressage.errors import ConfigError


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` (a library of the pyproject extra ``extra``), or raise a one-line
    :class:`ConfigError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (e.name == module or module.startswith(e.name + ".")):
            raise
        raise ConfigError(
            f"this recipe needs {module!r}, from the '{extra}' extra: pip install -e '.[{extra}]'"
        ) from None
