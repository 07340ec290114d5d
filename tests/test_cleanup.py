"""Cleanup steps at shutdown: a failure is logged (never silently dropped) and does not mask the error
being handled."""

from __future__ import annotations

import logging

import pytest

from dressage.cleanup import logged_failures

log = logging.getLogger("tests.cleanup")


def test_a_failed_cleanup_is_logged_and_the_original_error_wins(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tests.cleanup")
    with pytest.raises(ValueError, match="the real failure"):
        try:
            raise ValueError("the real failure")
        finally:
            with logged_failures(log, "stopping the proxy"):
                raise ConnectionResetError("proxy already gone")
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert warning.getMessage() == "stopping the proxy failed: ConnectionResetError: proxy already gone"
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)


def test_base_exceptions_are_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt), logged_failures(log, "step"):
        raise KeyboardInterrupt
