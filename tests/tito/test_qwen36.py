"""Qwen3.6: the native renderer equals ``qwen3_6.jinja``, and TITO is token-exact against it."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.tito.chat_template import QWEN36_TEMPLATE_SHA256, normalize_messages
from dressage.tito.official_templates import template_sha256
from dressage.tito.qwen_profile import Qwen36Profile
from dressage.tito.tokenizer import Tokenizer
from tests.tito import corpus as qwen_corpus
from tests.tito.family_corpus import CONVERSATIONS
from tests.tito.family_harness import walk
from tests.tito.references import qwen36_reference, render_official, template


@pytest.fixture(scope="module", params=[False, True], ids=["default", "preserve"])
def profile(request: pytest.FixtureRequest, qwen_tok: Tokenizer) -> Qwen36Profile:
    return Qwen36Profile(preserve_thinking=request.param, tokenizer=qwen_tok)


def test_official_hash() -> None:
    assert template_sha256(template("qwen3_6.jinja")) == QWEN36_TEMPLATE_SHA256


def test_renderer_matches_official_text(profile: Qwen36Profile) -> None:
    """Every Qwen3.5 corpus conversation, with and without generation prompt and thinking switch."""
    preserve = profile.flavor.preserve_thinking
    for name, messages, tools in qwen_corpus.CONVERSATIONS:
        normalized = normalize_messages(messages)
        for gen in (True, False):
            for thinking in (None, True, False):
                kwargs: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
                if preserve:
                    kwargs["preserve_thinking"] = True
                want = render_official("qwen3_6.jinja", normalized, tools, gen, **kwargs)
                got = profile.render(messages, tools, gen, thinking)
                assert got == want, f"{name} gen={gen} thinking={thinking}"


@pytest.mark.parametrize("thinking", [None, False])
def test_corpus_token_exact(profile: Qwen36Profile, thinking: bool | None) -> None:
    """The family corpus, request by request through TITO: 0 token mismatches with the reference."""
    reference = qwen36_reference(profile.flavor.preserve_thinking)
    total = requests = 0
    for name, messages, tools in CONVERSATIONS:
        result = walk(profile, reference, qwen_output, messages, tools, thinking)
        assert result.mismatches == 0, f"{name}: {result.first_problem}"
        total += result.tokens
        requests += result.requests
    assert requests >= 60 and total > 10_000


def test_preserve_thinking_keeps_one_segment(qwen_tok: Tokenizer) -> None:
    """With preserve_thinking a new user turn appends; without it the old reasoning is dropped."""
    from tests.tito.family_corpus import answer, user

    messages = [user("2+2?"), answer("4.", "Add them."), user("And 3+3?"), answer("6.", "Again."), user("ok")]
    for preserve, routes in (
        (True, ["create", "append", "append"]),
        (False, ["create", "create:think_stripped"] * 1),
    ):
        p = Qwen36Profile(preserve_thinking=preserve, tokenizer=qwen_tok)
        result = walk(p, qwen36_reference(preserve), qwen_output, messages, None, None)
        assert result.mismatches == 0
        assert result.routes[: len(routes)] == routes


def qwen_output(
    profile: Any, messages: list[dict[str, Any]], reply: dict[str, Any], tools: Any, thinking: Any
) -> str:
    """What the model generates for ``reply``: its template form after the generation prompt."""
    parts = profile.render_parts(
        [*messages, reply], tools, add_generation_prompt=False, enable_thinking=thinking
    )
    return parts.messages[-1][len(profile.generation_prompt_suffix(thinking)) : -1]
