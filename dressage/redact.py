"""Redaction: secrets never reach logs or stored errors.

Removes bearer tokens, API-key-like strings, ``Authorization`` headers, passwords in database URLs
and any configured secret values from text before it is logged or written to the event log.
:func:`redact_json` does the same for every string of a JSON-like value (session metadata, reward
details). The secret values are the settings' ``secrets`` plus a run's declared secrets (see
:mod:`dressage.rollout.secrets`), which the worker adds to its store's list.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

# Each pattern keeps its named group ``keep`` (a label such as "Authorization: ") and replaces the rest.
_PATTERNS = [
    re.compile(r"(?i)(?P<keep>authorization\s*[:=]\s*)(?:bearer\s+)?[^\s,;'\"]+"),
    re.compile(r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?P<keep>)\b(?:sk|pk|rk|ak)-[A-Za-z0-9_-]{12,}"),
    re.compile(r"(?P<keep>)\be2b_[A-Za-z0-9]{16,}"),
    re.compile(r"(?P<keep>)\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"(?P<keep>)\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"(?P<keep>)\bxox[abpr]-[A-Za-z0-9-]{10,}"),
    re.compile(
        r"(?i)(?P<keep>(?:api[_-]?key|secret|password|passwd|token)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]{6,}"
    ),
    re.compile(r"(?P<keep>[a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s/]+(?=@)"),
]


def redact_json(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every string, keys included, redacted."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact_json(k, secrets): redact_json(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v, secrets) for v in value]
    return value


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """Return ``text`` with secrets replaced by ``[REDACTED]`` (None stays None)."""
    if text is None:
        return None
    out = text
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        out = pattern.sub(lambda m: m.group("keep") + REDACTED, out)
    return out


def db_error_text(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """What a database error says, without the SQL statement or its parameters, redacted.

    SQLAlchemy's message appends ``[SQL: ...]`` and ``[parameters: ...]`` (which can hold a token's
    digest or a row's content): only the driver's first line is kept, and it names the problem.
    """
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    first = lines[0] if lines else type(orig).__name__
    first = first.split("[SQL:", 1)[0].strip() or type(orig).__name__
    return redact(first, secrets) or ""


class RedactingFilter(logging.Filter):
    """Redacts every record a handler emits: message, arguments and traceback text alike.

    Installed on the handlers (not on loggers), so records of third-party loggers such as
    ``httpx``/``httpcore`` at debug level (which print response headers) are redacted too.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage(), self.secrets) or ""
        record.args = None
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
            record.exc_info = None
        return True


def install_log_redaction(secrets: Iterable[str] = ()) -> None:
    """Put a :class:`RedactingFilter` on every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter(secrets))
