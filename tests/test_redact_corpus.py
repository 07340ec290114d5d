"""The redaction corpus: every covered key format is redacted in every context, whole; text that only
looks a little like a secret (token ids, hashes, uuids, base64 content, URLs, paths, log lines)
comes out unchanged. See tests/secret_corpus.py for the values."""

from __future__ import annotations

import json

import pytest

from dressage.redact import REDACTED, redact, redact_json, redacted_tail, secret_spans
from tests.secret_corpus import BARE_CONTEXTS, FORMAT_TEMPLATES, benign_texts, fake_secrets

SECRETS = fake_secrets(seed=33)


def _cases() -> list[tuple[str, str, str]]:
    """(format, text holding the secret, the same text with ``[REDACTED]`` in its place)."""
    cases = []
    for fmt, value in SECRETS.items():
        template = FORMAT_TEMPLATES.get(fmt)
        contexts = [template] if template else list(BARE_CONTEXTS)
        cases += [(fmt, ctx.format(value), ctx.format(REDACTED)) for ctx in contexts]
    return cases


@pytest.mark.parametrize(("fmt", "text", "expected"), _cases(), ids=lambda x: x if len(x) < 24 else "")
def test_every_format_is_redacted_whole(fmt: str, text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", benign_texts())
def test_benign_text_is_left_alone(text: str) -> None:
    assert redact(text) == text
    assert secret_spans(text) == []


def test_a_whole_corpus_document_keeps_no_secret_and_all_benign_text() -> None:
    """One long text mixing both corpora (as an agent log would): no secret's value survives, not
    even an 8-character piece of its random part, and every benign line is still there."""
    benign = benign_texts()
    lines = [f"{b}\n{t}" for b, (_, t, _) in zip(benign * 4, _cases(), strict=False)]
    out = redact("\n".join(lines)) or ""
    for fmt, value in SECRETS.items():
        body = value.split("-----")[2] if fmt.startswith("pem") else value
        pieces = {body[i : i + 8] for i in range(8, len(body) - 8)} - {"", "\n"}
        leaked = sorted(p for p in pieces if "\n" not in p and p in out)
        assert leaked == [], f"{fmt}: {leaked[:3]}"
    for text in benign:
        assert text in out


def test_json_values_under_credential_keys_are_redacted() -> None:
    """``redact_json`` judges a key and its string value as the assignment ``key=value``."""
    doc = {
        "api_key": "plainlowentropy",
        "db_password": "hunter22",
        "cache_key": "user-42",
        "upload_key": SECRETS["generic_key"],
        "token_ids": [1, 2, 3],
        "token": "151645",
        "nested": [{"client_secret": "abcdef"}, f"bare {SECRETS['huggingface']}"],
    }
    assert redact_json(doc) == {
        "api_key": REDACTED,
        "db_password": REDACTED,
        "cache_key": "user-42",
        "upload_key": REDACTED,
        "token_ids": [1, 2, 3],
        "token": "151645",
        "nested": [{"client_secret": REDACTED}, f"bare {REDACTED}"],
    }


def test_configured_values_and_patterns_together() -> None:
    text = f"pw hunter2 and {SECRETS['npm']} with password=hunter2"
    assert redact(text, ("hunter2",)) == f"pw {REDACTED} and {REDACTED} with password={REDACTED}"


def test_a_long_log_without_secrets_is_returned_as_is() -> None:
    log = "\n".join(benign_texts()) * 2000  # ~2.5 MB: the hints send it through every detector once
    assert redact(log) is log or redact(log) == log


def test_a_tail_is_redacted_before_it_is_cut() -> None:
    """An error quotes the end of a program's output: cut first, a PEM block would lose its BEGIN
    line and a key its prefix, and neither would be found any more."""
    pem, key = SECRETS["pem_rsa"], SECRETS["github_classic"]
    text = f"{pem}\nfailed with {key} and the configured value hunter22\n"
    naive = text[-300:]  # what cutting first would store: PEM lines without their BEGIN
    assert any(line in (redact(naive) or "") for line in pem.splitlines()[1:-1])  # ...and redact can't tell
    tail = redacted_tail(text, 300, ("hunter22",))
    assert tail == f"{REDACTED}\nfailed with {REDACTED} and the configured value {REDACTED}\n"
    cut = redacted_tail(f"start plain-value-123 {REDACTED} end", 20)
    assert cut == f"{REDACTED} end"  # the cut falls after whitespace: no half of a value
    assert redacted_tail("short", 100) == "short"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", f"Authorization: {REDACTED}"),
        ("curl -H 'Authorization: Bearer $TOKEN'", "curl -H 'Authorization: Bearer $TOKEN'"),
        (
            "HF_TOKEN=abcdef123456 TOKENIZERS_PARALLELISM=falsely",
            f"HF_TOKEN={REDACTED} TOKENIZERS_PARALLELISM=falsely",
        ),
    ],
)
def test_headers_and_variables(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_a_service_account_file_loses_its_key_only() -> None:
    """A PEM block inside a JSON string (``\\n`` escaped) goes whole; the ids around it stay."""
    doc = {
        "type": "service_account",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": SECRETS["pem_pkcs8"] + "\n",
        "client_email": "fake@fake-project.iam.gserviceaccount.com",
    }
    text = json.dumps(doc)
    assert json.loads(redact(text) or "") == doc | {"private_key": REDACTED + "\n"}
