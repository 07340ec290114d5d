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


def redact_json(value: object, secrets: Iterable[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every string, keys included, redacted."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact_json(k, secrets): redact_json(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v, secrets) for v in value]
    return value


# A substring (of the lower-cased text) that every pattern's match contains: text holding none of
# them cannot match, and the patterns (slow on long text) are skipped.
_HINTS = (
    "authorization", "bearer", "sk-", "pk-", "rk-", "ak-", "e2b_", "ghp_", "gho_", "ghu_", "ghs_",
    "ghr_", "akia", "xox", "api", "secret", "passw", "token", "://",
)  # fmt: skip


def _may_match(text: str) -> bool:
    low = text.lower()
    return any(hint in low for hint in _HINTS)


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """Return ``text`` with secrets replaced by ``[REDACTED]`` (None stays None)."""
    if text is None:
        return None
    out = text
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, REDACTED)
    if not _may_match(out):
        return out
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
        if record.exc_info and not record.exc_text:
            # Formatters print a cached exc_text instead of formatting exc_info again; the exception
            # object stays on the record for whoever inspects it in-process.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
        return True


def install_log_redaction(secrets: Iterable[str] = ()) -> list[tuple[logging.Handler, RedactingFilter]]:
    """Put a :class:`RedactingFilter` on every handler of the root logger; returns what it added."""
    added = []
    for handler in logging.getLogger().handlers:
        redacting = RedactingFilter(secrets)
        handler.addFilter(redacting)
        added.append((handler, redacting))
    return added


def secret_spans(text: str, secrets: Iterable[str] = ()) -> list[tuple[int, int]]:
    """The ``(start, end)`` character ranges of ``text`` that :func:`redact` would replace, merged.

    For views that show text in pieces (the viewer's token stream), where a secret can span pieces.
    """
    spans: list[tuple[int, int]] = []
    for secret in secrets:
        if secret and len(secret) >= 4:
            start = text.find(secret)
            while start >= 0:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + 1)
    for pattern in _PATTERNS if _may_match(text) else ():
        spans += [(m.start() + len(m.group("keep")), m.end()) for m in pattern.finditer(text)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
