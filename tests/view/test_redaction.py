"""Redaction as the viewer uses it: spans of secrets in text shown in pieces, and the keyword
prefilter that lets long texts skip the patterns (it must never change what is redacted)."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.redact import REDACTED, redact, secret_spans
from dressage.store.records import Turn
from dressage.view.decode import TokenDecoder
from dressage.view.tokens import turn_tokens

SAMPLES = [
    "Authorization: Bearer abcdefghijklmnop",
    "AUTHORIZATION=xyz123456",
    "curl -H 'bearer QWERTYUIOPASDFGH'",
    "key sk-ABCDEFGHIJKLMNOP1234 and more",
    "E2B key e2b_0123456789abcdefXYZ",
    "gh token ghp_abcdefghijklmnopqrstuvwx",
    "aws AKIAABCDEFGHIJKLMNOP",
    "slack xoxb-1234567890-abc",
    'API_KEY="hunter22secret"',
    "Password: correcthorse",
    "postgresql://user:pa55word@db:5432/x",
    "nothing secret here, just text about apis",
    "plain prose without any keyword at all",
]


def _apply(text: str, spans: list[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in spans:
        out += [text[pos:start], REDACTED]
        pos = end
    return "".join([*out, text[pos:]])


@pytest.mark.parametrize("text", SAMPLES)
def test_spans_give_what_redact_gives(text: str) -> None:
    assert _apply(text, secret_spans(text, ("hunter2",))) == redact(text, ("hunter2",))


def test_a_secret_split_over_tokens_becomes_one_redacted_piece() -> None:
    pieces = ["see ", "api", "_key", "=", "sk-", "ABCDEF", "GHIJKLMNOP", " ok"]
    vocab = {i: p for i, p in enumerate(pieces)}
    decoder = TokenDecoder(lambda ids: "".join(vocab[i] for i in ids))
    n = len(pieces)
    turn = Turn(
        id="t", session_id="s", turn_index=0, thread_index=0, parent_turn_id=None, route="create",
        segment_index=0, segment_offset=0, boundary_reason=None, context_ids=np.arange(n, dtype=np.int32),
        generated_ids=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32), loss_mask=np.zeros(0, bool),
        policy_versions=np.zeros(0, np.int32), routed_experts=None, finish_reason="stop", sampling_params={},
        request_fingerprint=None, content_hash="", latency_ms=None, info={}, position=1,
    )  # fmt: skip
    out = turn_tokens(turn, decoder)
    assert "".join(out["t"]) == "see api_key=" + REDACTED + " ok"
    assert out["t"].count(REDACTED) == 1
    hidden = [i for i, t in enumerate(out["t"]) if t in (REDACTED, "")]
    assert hidden == [4, 5, 6] and all(out["id"][i] is None for i in hidden)
    assert out["id"][:4] == [0, 1, 2, 3] and out["id"][7] == 7
