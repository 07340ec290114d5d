"""Fixtures the recipe tests share with the viewer's tests: headless Chromium (``browser``, browser tier)."""

from tests.view.conftest import browser

__all__ = ["browser"]
