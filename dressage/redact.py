"""Redaction: secrets never reach logs or stored errors.

Removes credentials from text before it is logged or written to the event log; :func:`redact_json`
does the same for every string of a JSON-like value (session metadata, reward details). Three
sources of "what is a secret", one result (the text with each secret replaced by ``[REDACTED]``):

- **configured values**: the settings' ``secrets`` plus a run's declared secrets (see
  :mod:`dressage.rollout.secrets`), which the worker adds to its store's list;
- **known key formats**, found by the regex plugins of ``detect-secrets`` (AWS access keys, Azure
  storage keys, GitHub, GitLab, JWTs, Mailchimp, npm ``_authToken``, OpenAI legacy keys, PyPI,
  SendGrid, Slack tokens and webhooks, Square, Stripe live keys) and by the patterns below for
  the formats it lacks (``Authorization``/bearer values, ``sk-``/``sk-ant-``/``sk-proj-`` keys,
  Stripe test/restricted keys, Hugging Face ``hf_``, Google ``AIza``, GitHub ``github_pat_``, bare
  npm ``npm_``, E2B, Slack ``xox*-``/``xapp-``, Azure SAS ``sig=``, whole PEM private key blocks,
  passwords in URLs); a match runs on to the end of the token (a plugin's fixed length is a minimum);
- **assignments** ``name=value`` / ``name: value`` (JSON, YAML, headers, env files): a value after a
  name holding ``password``, ``secret``, ``token``, ``api_key``, ``access_key``, ``private_key``... is
  redacted whatever it looks like (a shell variable such as ``$API_KEY`` and a number after
  ``token`` excepted); after any other ``...key`` name only a high-entropy value is (detect-secrets'
  Shannon entropy over its base64/hex alphabets), so ``cache_key=user-42`` stays.

Free text is otherwise left alone: hashes, uuids, token ids and base64 content are not secrets by
shape. Each format has a cheap substring "hint": a text holding no hint skips the regexes (long
logs are mostly such text).
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin


REDACTED = "[REDACTED]"

Span = tuple[int, int]

# detect-secrets plugins (module and class under ``detect_secrets.plugins``), each with the lower-case
# substrings one of which every match contains. Left out: plugins that would redact what is not a
# secret (public IP addresses; Artifactory's ``AP...`` matches upper-case words), or that only have
# meaning next to a keyword the assignment rule below already handles (IBM, Softlayer, Cloudant), or
# that have no literal to skip text by (Discord, Telegram, Twilio), and PrivateKeyDetector (it flags
# the header line: the whole block is a pattern below).
_PLUGINS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("aws", "AWSKeyDetector", ("akia", "asia", "abia", "acca", "a3t", "aws")),
    ("azure_storage_key", "AzureStorageKeyDetector", ("accountkey=",)),
    ("github_token", "GitHubTokenDetector", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    ("gitlab_token", "GitLabTokenDetector", ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "gr1348941",
                                             "glcbt-", "glimt-", "glptt-", "glagent-", "gloas-")),
    ("jwt", "JwtTokenDetector", ("eyj",)),
    ("mailchimp", "MailchimpDetector", ("-us",)),
    ("npm", "NpmDetector", ("_authtoken",)),
    ("openai", "OpenAIDetector", ("t3blbkfj",)),
    ("pypi_token", "PypiTokenDetector", ("pypi-",)),
    ("sendgrid", "SendGridDetector", ("sg.",)),
    ("slack", "SlackDetector", ("xox", "hooks.slack.com")),
    ("square_oauth", "SquareOAuthDetector", ("sq0csp-",)),
    ("stripe", "StripeDetector", ("k_live_",)),
)  # fmt: skip


@functools.cache
def _plugin(module: str, name: str) -> RegexBasedDetector:
    """The detect-secrets plugin ``name`` of ``module``, imported and built on first use.

    Importing detect-secrets costs about 0.1 s of CPU (its package pulls in ``requests``); a process
    whose texts never hint at one of its formats (most of them: the hints are checked first) never
    pays it.
    """
    plugins = importlib.import_module(f"detect_secrets.plugins.{module}")
    detector: RegexBasedDetector = getattr(plugins, name)()
    return detector


@functools.cache
def _entropy(alphabet: str) -> HighEntropyStringsPlugin:
    """detect-secrets' Shannon entropy plugin of ``alphabet`` (``hex`` or ``base64``) with our limit,
    built on first use (see :func:`_plugin`)."""
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString

    return HexHighEntropyString(limit=3.0) if alphabet == "hex" else Base64HighEntropyString(limit=3.7)


# Formats detect-secrets lacks. Each keeps its named group ``keep`` (a label such as
# "Authorization: ") and replaces the rest.
_PATTERNS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (
        re.compile(
            r"(?i)(?P<keep>authorization\s*[:=]\s*)"
            r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|apikey|key)\s+)?+"  # a scheme, replaced with its credential
            r"(?!\$\{?[A-Za-z_])[^\s,;'\"]+"  # a value, not a variable ($TOKEN) a shell fills in
        ),
        ("authorization",),
    ),
    (re.compile(r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"), ("bearer",)),
    # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-), this project's session tokens
    (re.compile(r"(?P<keep>)\b(?:sk|pk|rk|ak)-[A-Za-z0-9_-]{12,}"), ("sk-", "pk-", "rk-", "ak-")),
    (re.compile(r"(?P<keep>)\b(?:sk|rk)_(?:live|test)_[0-9a-zA-Z]{16,}"), ("k_live_", "k_test_")),
    (re.compile(r"(?P<keep>)\be2b_[A-Za-z0-9]{16,}"), ("e2b_",)),
    (re.compile(r"(?P<keep>)\bgh[pousr]_[A-Za-z0-9]{20,}"), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (re.compile(r"(?P<keep>)\bgithub_pat_[A-Za-z0-9_]{22,}"), ("github_pat_",)),
    (re.compile(r"(?P<keep>)\bhf_[A-Za-z0-9]{30,}"), ("hf_",)),
    (re.compile(r"(?P<keep>)\bAIza[0-9A-Za-z_-]{35}"), ("aiza",)),
    (re.compile(r"(?P<keep>)\bnpm_[A-Za-z0-9]{36}"), ("npm_",)),
    (re.compile(r"(?P<keep>)\bxox[abposr]-[A-Za-z0-9-]{10,}"), ("xox",)),
    (re.compile(r"(?P<keep>)\bxapp-[0-9]+-[A-Za-z0-9-]{10,}"), ("xapp-",)),
    (re.compile(r"(?i)(?P<keep>[?&;]sig=)[A-Za-z0-9%+/=_-]{16,}"), ("sig=",)),  # Azure SAS
    (
        re.compile(
            r"(?P<keep>)-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?(?:-----END[A-Z0-9 ]*-----|\Z)"
        ),
        ("private key",),
    ),
    (re.compile(r"(?P<keep>[a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s/]+(?=@)"), ("://",)),
)

# ``name=value`` / ``"name": "value"``: the name ends in a keyword, the value runs to a delimiter.
_ASSIGNMENT = re.compile(r"""(?i)(?:key|token|secret|passw(?:or)?d|pwd)(["']?\s*[:=]\s*["']?)([^\s"',;}]+)""")
_ASSIGNMENT_HINTS = ("key", "token", "secret", "passw", "pwd")
_NAME_END = re.compile(r"(?i)(?:key|token|secret|passw(?:or)?d|pwd)$")  # HF_TOKEN, not TOKENIZERS_...
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.-]")
_MAX_NAME_CHARS = 128  # a longer name is judged by its last 128 characters (bounds the work per match)
# A name matching this is a credential's whatever its value; other ``...key`` names need entropy.
_STRONG_NAME = re.compile(
    r"(?i)passw|pwd|secret|token|(?:api|access|private|account|auth|signing|encryption|master|client)[_.-]?key"
    r"|sharedaccesskey"
)
_VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")  # $API_KEY, ${API_KEY}: a reference, not a value
_BASE64_VALUE = re.compile(r"[A-Za-z0-9+/=_-]{16,}")
_HEX_VALUE = re.compile(r"[0-9a-fA-F]{16,}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")  # an id (idempotency keys)

# What follows a match and still belongs to the token (a plugin's ``{24}`` is a minimum length).
_TOKEN_TAIL = re.compile(r"(?:[A-Za-z0-9_-]|[.+/](?=[A-Za-z0-9_-]))*=*")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_LABEL = re.compile(r"[A-Za-z_]+=")


def is_secret_value(name: str, value: str) -> bool:
    """Whether ``value``, assigned to ``name`` (``api_key``, ``password``, ``cache_key``...), is a secret.

    Only a name ending in ``key``, ``token``, ``secret``, ``password``/``passwd`` or ``pwd`` can hold
    one (``HF_TOKEN``, ``"api_key"``; not ``TOKENIZERS_PARALLELISM``). A credential-like name
    (password, secret, token, api/access/private key...) makes any value of 6+ characters one,
    except a variable reference (``$API_KEY``) and, for a token, a number (a token id). Any other
    name ending in ``key`` needs a high-entropy value (16+ characters of the base64 or hex alphabet,
    letters and digits, over detect-secrets' Shannon entropy limits) that is not a uuid (an
    idempotency key).
    """
    if len(value) < 6 or value == REDACTED or _VARIABLE.fullmatch(value) or not _NAME_END.search(name):
        return False
    if _STRONG_NAME.search(name):
        return not (value.isdigit() and "token" in name.lower())
    if not name.lower().endswith("key") or not _BASE64_VALUE.fullmatch(value) or _UUID.fullmatch(value):
        return False
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    entropy = _entropy("hex" if _HEX_VALUE.fullmatch(value) else "base64")
    return entropy.calculate_shannon_entropy(value) > entropy.entropy_limit


def _configured_spans(text: str, secrets: Iterable[str]) -> Iterator[Span]:
    for secret in secrets:
        if secret and len(secret) >= 4:
            start = text.find(secret)
            while start >= 0:
                yield start, start + len(secret)
                start = text.find(secret, start + 1)


def _plugin_spans(text: str, low: str) -> Iterator[Span]:
    for module, name, hints in _PLUGINS:
        if not any(h in low for h in hints):
            continue
        for value in set(_plugin(module, name).analyze_string(text)):
            start = text.find(value) if value else -1
            while start >= 0:
                if start == 0 or not _ALNUM.match(text, start - 1):  # not the inside of a longer word
                    label = _LABEL.match(value)  # Azure's match starts with "AccountKey="
                    yield start + (label.end() if label else 0), start + len(value)
                start = text.find(value, start + 1)


def _pattern_spans(text: str, low: str) -> Iterator[Span]:
    for pattern, hints in _PATTERNS:
        if any(h in low for h in hints):
            for m in pattern.finditer(text):
                yield m.start() + len(m.group("keep")), m.end()


def _assignment_spans(text: str, low: str) -> Iterator[Span]:
    if not any(h in low for h in _ASSIGNMENT_HINTS):
        return
    for m in _ASSIGNMENT.finditer(text):
        start, stop = m.start(), max(m.start() - _MAX_NAME_CHARS, 0)
        while start > stop and _NAME_CHAR.match(text, start - 1):
            start -= 1
        name = text[start : m.start(1)]
        if is_secret_value(name, m.group(2)):
            yield m.start(2), m.end(2)


def _extend(text: str, span: Span) -> Span:
    """``span`` run on to the end of the token it starts (a key longer than its format's minimum)."""
    tail = _TOKEN_TAIL.match(text, span[1])
    return span[0], tail.end() if tail else span[1]


def secret_spans(text: str, secrets: Iterable[str] = ()) -> list[Span]:
    """The ``(start, end)`` character ranges of ``text`` that :func:`redact` replaces, merged.

    For views that show text in pieces (the viewer's token stream), where a secret can span pieces.
    """
    low = text.lower()
    spans = list(_configured_spans(text, secrets))
    spans += [_extend(text, s) for s in _plugin_spans(text, low)]
    spans += list(_pattern_spans(text, low))
    spans += list(_assignment_spans(text, low))
    merged: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """Return ``text`` with secrets replaced by ``[REDACTED]`` (None stays None)."""
    if text is None:
        return None
    spans = secret_spans(text, secrets)
    if not spans:
        return text
    out, pos = [], 0
    for start, end in spans:
        out += [text[pos:start], REDACTED]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redacted_tail(text: str, max_chars: int, secrets: Iterable[str] = ()) -> str:
    """The end of ``text``, at most ``max_chars``, redacted *before* it is cut (for error messages
    quoting a program's output).

    Cutting first could leave the back half of a key (no longer recognisable by its prefix) or a PEM
    block's body without its ``BEGIN`` line. The cut falls just after whitespace, so a secret that
    the text is redacted for later (a run's declared value, where the message is stored) is whole.
    """
    out = redact(text, secrets) or ""
    if len(out) <= max_chars:
        return out
    tail = out[-max_chars:]
    space = re.search(r"\s", tail)
    return tail[space.end() :] if space else tail


def redact_json(value: object, secrets: Iterable[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every string, keys included, redacted.

    A string under a credential-like key (``{"api_key": "..."}``) is judged as the assignment
    ``api_key=...`` would be (see :func:`is_secret_value`).
    """
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact_json(k, secrets): _redact_entry(k, v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v, secrets) for v in value]
    return value


def _redact_entry(key: object, value: object, secrets: tuple[str, ...]) -> Any:
    if isinstance(key, str) and isinstance(value, str) and is_secret_value(key, value):
        return REDACTED
    return redact_json(value, secrets)


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
