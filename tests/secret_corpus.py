"""Fake credentials of every format :mod:`dressage.redact` covers, and text that holds none.

The values are generated (``random.Random(seed)``): they have each provider's shape (prefix,
alphabet, length, a JWT's decodable JSON parts, a PEM block's base64 lines) and are not anyone's
key. :func:`fake_secrets` gives one of each format; a different seed gives different values, so a
test can plant them as canaries and grep for them afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import random
import string
import uuid

ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
UPPER_DIGITS = string.ascii_uppercase + string.digits


def _pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": f"fake-{rng.randrange(10**9)}", "iat": 1700000000, "scope": "canary"}
    return f"{header}.{_b64url(json.dumps(claims).encode())}.{_b64url(rng.randbytes(32))}"


def _pem(rng: random.Random, label: str) -> str:
    body = base64.b64encode(rng.randbytes(300)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"])


def fake_secrets(seed: int) -> dict[str, str]:
    """One fake credential per format, by format name (values depend on ``seed`` only)."""
    rng = random.Random(seed)
    p = _pick
    return {
        "huggingface": "hf_" + p(rng, string.ascii_letters, 34),
        "google_api_key": "AIza" + p(rng, URLSAFE, 35),
        "jwt": _jwt(rng),
        "pem_rsa": _pem(rng, "RSA PRIVATE KEY"),
        "pem_pkcs8": _pem(rng, "PRIVATE KEY"),
        "pem_openssh": _pem(rng, "OPENSSH PRIVATE KEY"),
        "stripe_live": "sk_live_" + p(rng, ALNUM, 24),
        "stripe_live_long": "sk_live_51" + p(rng, ALNUM, 97),
        "stripe_restricted": "rk_live_" + p(rng, ALNUM, 24),
        "stripe_test": "sk_test_" + p(rng, ALNUM, 24),
        "slack_bot": f"xoxb-{p(rng, string.digits, 11)}-{p(rng, string.digits, 13)}-{p(rng, ALNUM, 24)}",
        "slack_user": f"xoxp-{p(rng, string.digits, 11)}-{p(rng, string.digits, 12)}-{p(rng, string.digits, 13)}-"
        + p(rng, string.hexdigits.lower()[:16], 32),
        "slack_webhook": f"https://hooks.slack.com/services/T{p(rng, UPPER_DIGITS, 10)}/B{p(rng, UPPER_DIGITS, 10)}/"
        + p(rng, ALNUM, 24),
        "azure_account_key": base64.b64encode(rng.randbytes(64)).decode(),
        "azure_sas_sig": base64.b64encode(rng.randbytes(32)).decode().replace("+", "%2B").replace("/", "%2F"),
        "gitlab": "glpat-" + p(rng, URLSAFE, 20),
        "npm": "npm_" + p(rng, ALNUM, 36),
        "pypi": "pypi-AgEIcHlwaS5vcmc" + p(rng, URLSAFE, 150),
        "anthropic": "sk-ant-api03-" + p(rng, URLSAFE, 93) + "AA",
        "openai_project": "sk-proj-" + p(rng, URLSAFE, 156),
        "openai_legacy": "sk-" + p(rng, ALNUM, 20) + "T3BlbkFJ" + p(rng, ALNUM, 20),
        "github_classic": "ghp_" + p(rng, ALNUM, 36),
        "github_oauth": "gho_" + p(rng, ALNUM, 36),
        "github_fine_grained": "github_pat_" + p(rng, ALNUM, 22) + "_" + p(rng, ALNUM, 59),
        "aws_access_key": "AKIA" + p(rng, UPPER_DIGITS, 16),
        "aws_secret_key": p(rng, ALNUM + "+/", 40),
        "generic_key": p(rng, ALNUM, 32),
        "generic_token": p(rng, URLSAFE, 24),
        "generic_secret": p(rng, ALNUM, 20),
        "generic_password": "correct-horse-" + p(rng, string.ascii_lowercase, 6),
        "json_api_key": p(rng, ALNUM, 40),
        "yaml_api_key": p(rng, ALNUM, 40),
    }


# Where a format appears in real text: the value needs its label (``AccountKey=``, ``sig=``...).
# ``{}`` is the value; the rest of the template must survive redaction.
FORMAT_TEMPLATES = {
    "azure_account_key": (
        "DefaultEndpointsProtocol=https;AccountName=fakeacct;AccountKey={};EndpointSuffix=core.windows.net"
    ),
    "azure_sas_sig": (
        "https://fakeacct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sp=r&se=2030-01-01T00:00:00Z&sig={}"
    ),
    "npm": "//registry.npmjs.org/:_authToken={}",
    "aws_secret_key": "aws_secret_access_key = {}",
    "generic_key": "GET /v1/items?key={}",
    "generic_token": "token={}",
    "generic_secret": "client secret={}",
    "generic_password": "password: {}",
    "json_api_key": '{{"api_key": "{}", "model": "m"}}',
    "yaml_api_key": "provider:\n  api_key: {}\n  region: eu",
}

# Contexts every bare format is tried in: prose, quotes, JSON, a log line, line starts and ends.
BARE_CONTEXTS = (
    "{}",
    "using {} now",
    "error: upstream refused '{}'.",
    '{{"value": "{}", "n": 1}}',
    "2026-12-07 03:44:32 WARNING agent: retrying with {}\nnext line",
    "first line\n{}",
)


def benign_texts() -> list[str]:
    """Text that looks a little like secrets but holds none: :func:`redact` must leave it as it is."""
    sha = hashlib.sha256(b"turn 3 content").hexdigest()
    rng = random.Random(7)
    uuids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(20)]
    u = uuids[0]
    b64_text = base64.b64encode(b"The quick brown fox jumps over the lazy dog, twice.").decode()
    b64_json = base64.b64encode(json.dumps({"role": "user", "content": "hi"}).encode()).decode()
    return [
        "token ids: [151644, 872, 198, 9707, 151645]",
        "token_ids=[151644, 872, 198]",
        '{"token_ids": [1, 2, 3], "logprobs": [-0.1, -0.2]}',
        "eos token=151645",
        "max_tokens=8192 prompt_tokens=123 completion_tokens=45",
        f"sha256={sha}",
        f'{{"sha256": "{sha}", "size": 1234}}',
        f"artifact sha256:{sha} stored",
        f"content_hash {sha}",
        f"commit {hashlib.sha1(b'x').hexdigest()}",
        f"session {u} finished",
        f"run_id: {u}",
        *(f'{{"session_id": "{u}", "idempotency_key": "{v}"}}' for u, v in itertools.pairwise(uuids)),
        f"payload {b64_text}",
        f"data:application/json;base64,{b64_json}",
        "https://example.com/path/to/page?x=1&y=two#frag",
        "http://127.0.0.1:8000/v1/chat/completions",
        "postgresql+psycopg://postgres@127.0.0.1:5432/dressage",
        "https://huggingface.co/Qwen/Qwen3-0.6B/resolve/main/config.json",
        "/root/.cache/dressage/artifacts/ab/cd/abcdef0123456789",
        "tests/rollout/test_canary.py::test_declared_secrets[sqlite]",
        "2026-12-07 03:44:32 INFO dressage.rollout.worker: session 12 finished reward=1.0 turns=3",
        'HTTP Request: POST http://127.0.0.1:30000/generate "HTTP/1.1 200 OK"',
        "KeyError: 'messages'",
        "idem_key=turn-3-abc cache_key=user-42 sort key: created_at",
        "key=value monkey: banana primary_key=id",
        "secrets: {sandbox: [GITHUB_TOKEN], agent: [UPSTREAM_API_KEY]}",
        "password: $DB_PASSWORD api_key=${OPENAI_API_KEY}",
        "set the api_key field and the token in the environment",
        "ASIAN MARKETS CLOSED; AKIA is a prefix",
        "The model answered: 42. Tool output: total 12K drwxr-xr-x 2 root root 4.0K",
        "hf_hub_download(repo_id='Qwen/Qwen3-0.6B')",
    ]
