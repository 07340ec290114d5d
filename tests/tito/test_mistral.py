"""Mistral NeMo: our text rendering + Tekken vocabulary give exactly ``mistral-common``'s encoder ids."""

from __future__ import annotations

from typing import Any

import pytest

from dressage.errors import TemplateError
from dressage.tito.mistral_profile import MistralNemoProfile
from tests.tito.family_corpus import CONVERSATIONS, TOOLS, answer, calls, result, user
from tests.tito.family_harness import walk
from tests.tito.references import mistral_reference, mistral_tekkenizer

EXTRA = [
    ("system_between_users", [user("A"), {"role": "system", "content": "Sys"}, user("C")], None),
    ("two_users_merge", [user("A"), user("B")], None),
    ("assistant_first", [{"role": "assistant", "content": "Hi, how can I help?"}, user("Go")], None),
    ("trailing_spaces", [user("A"), answer("B   "), user("C")], None),
    (
        "two_tool_turns",
        [user("Go"), calls(("bash", {"cmd": "a"})), result("1"), calls(("bash", {"cmd": "b"})), result("2")],
        TOOLS,
    ),
    ("empty_tool_result", [user("Go"), calls(("bash", {"cmd": "a"})), result("")], TOOLS),
]


@pytest.fixture(scope="module")
def profile() -> MistralNemoProfile:
    return MistralNemoProfile()


def test_vocabulary_matches_tekken(profile: MistralNemoProfile) -> None:
    """The built vocabulary encodes text like ``mistral-common``'s Tekkenizer and keeps its control ids."""
    tek = mistral_tekkenizer()
    for text in (
        "héllo 你好 😀 e\u0301 \u200b",
        "lorem ipsum " * 50,
        '{"a": [1, 2.5]}\n\n  x',
        "  sp\t\ttab\r\n",
    ):
        assert profile.tokenizer.encode(text) == tek.encode(text, bos=False, eos=False)
    for i in range(tek.num_special_tokens):
        assert profile.tokenizer.token_to_id(tek.id_to_piece(i)) == i
    assert profile.tokenizer.vocab_size == tek.n_words


@pytest.mark.parametrize(
    "name,messages,tools", CONVERSATIONS + EXTRA, ids=[c[0] for c in CONVERSATIONS + EXTRA]
)
def test_prompt_ids_equal_the_encoder(
    profile: MistralNemoProfile, name: str, messages: list[dict[str, Any]], tools: Any
) -> None:
    if messages[-1]["role"] == "assistant":
        messages = [*messages, user("Next?")]
    assert profile.tokenizer.encode(profile.render(messages, tools)) == mistral_reference(
        messages, tools, None
    )


def test_corpus_token_exact(profile: MistralNemoProfile) -> None:
    """The family corpus, request by request through TITO: 0 token mismatches with the encoder."""
    total = requests = 0
    for name, messages, tools in CONVERSATIONS + EXTRA:
        res = walk(profile, mistral_reference, mistral_output, messages, tools, None)
        assert res.mismatches == 0, f"{name}: {res.first_problem}"
        total += res.tokens
        requests += res.requests
        if name.startswith("agent_loop"):
            assert res.routes[1:] == ["append"] * (len(res.routes) - 1)
    assert requests >= 60 and total > 10_000


def test_parse_round_trip(profile: MistralNemoProfile) -> None:
    msg = calls(("get_weather", {"city": "Zürich", "days": 2}), ("bash", {"cmd": 'echo "x"\nls'}))
    prompt = [user("Go")]
    text = mistral_output(profile, prompt, msg, TOOLS, None).removesuffix("</s>")
    parsed = profile.parse_assistant(text, TOOLS, seed="s")
    assert [c["id"] for c in parsed.tool_calls] == ["call00000", "call00001"]
    again = profile.render([*prompt, parsed.to_message()], TOOLS)
    assert again == profile.render([*prompt, msg], TOOLS)
    without_ids = profile.parse_assistant('[TOOL_CALLS][{"name": "bash", "arguments": {}}]', seed="s")
    assert len(without_ids.tool_calls[0]["id"]) == 9
    assert profile.parse_assistant("[TOOL_CALLS][{oops").failures


def test_refusals(profile: MistralNemoProfile) -> None:
    with pytest.raises(TemplateError, match="no thinking switch"):
        profile.render([user("Hi")], None, True, False)
    both = {"role": "assistant", "content": "x", "tool_calls": calls(("bash", {"cmd": "a"}))["tool_calls"]}
    with pytest.raises(TemplateError, match="both content and tool calls"):
        profile.render([user("Hi"), both, result("1")], TOOLS)
    with pytest.raises(TemplateError, match="cannot follow"):
        profile.render([user("A"), answer("B"), {"role": "system", "content": "S"}, user("C")])


def mistral_output(
    profile: Any, messages: list[dict[str, Any]], reply: dict[str, Any], tools: Any, thinking: Any
) -> str:
    """What a Mistral model generates for ``reply`` (its encoded form, ending with ``</s>``)."""
    prompt = profile.render(messages, tools)
    full = profile.render([*messages, reply], tools)
    assert full.startswith(prompt)
    return full[len(prompt) :]


def test_tool_loop_renders_only_new_messages(profile: MistralNemoProfile) -> None:
    """The session renderer reuses earlier renderings in a tool loop and equals the full render."""
    from tests.tito.family_corpus import agent_loop

    renderer = profile.prompt_renderer()
    msgs = agent_loop(20)
    for k in range(2, len(msgs) + 1, 2):
        got = renderer.render(msgs[:k], TOOLS, None).text
        assert got == profile.render(msgs[:k], TOOLS)
        if k > 2:
            assert renderer.reused == k - 2  # type: ignore[attr-defined]
    renderer.render([*msgs, user("new question")], TOOLS, None)
    assert renderer.reused == 0  # type: ignore[attr-defined]


def test_forced_call_prefix_is_the_rendered_form(profile: MistralNemoProfile) -> None:
    msg = calls(("bash", {"cmd": "ls"}))
    out = mistral_output(profile, [user("Go")], msg, TOOLS, None)
    assert out.startswith(profile.forced_tool_call_prefix("bash"))
    assert out.startswith(profile.forced_tool_call_prefix(""))
