"""The incremental renderer equals the full (official-template-exact) rendering, whatever it reuses."""

from __future__ import annotations

import copy
import json
import random
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest

from dressage.errors import TemplateError
from dressage.tito.chat_template import normalize_messages, render_qwen35
from dressage.tito.incremental import PromptIds, SegmentIndex
from dressage.tito.profiles import FullRenderer, PromptRenderer
from dressage.tito.qwen_profile import Qwen35Profile
from dressage.tito.render_cache import IncrementalRenderer
from dressage.tito.tokenizer import Tokenizer
from tests.tito.corpus import CONVERSATIONS, TOOLS, _loop, call


def full(messages: list[dict[str, Any]], tools: Any, thinking: bool | None, default: bool = True) -> str:
    """NFC of the whole-conversation rendering (what the incremental renderer must equal)."""
    text = render_qwen35(messages, tools, enable_thinking=thinking, default_thinking=default)
    return unicodedata.normalize("NFC", text)


def has_query(messages: list[dict[str, Any]]) -> bool:
    try:
        render_qwen35(messages)
    except TemplateError:
        return False
    return True


@pytest.mark.parametrize("name,messages,tools", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_growing_and_shuffled_prefixes_match_full(
    name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> None:
    prefixes = [messages[:n] for n in range(1, len(messages) + 1) if has_query(messages[:n])]
    for default in (True, False):
        r = IncrementalRenderer(default_thinking=default)
        order = prefixes + random.Random(name).sample(prefixes, len(prefixes))  # grow, then jump around
        for prefix in order:
            for thinking in (None, True, False):
                got = r.render(prefix, tools, thinking)
                assert got.text == full(prefix, tools, thinking, default), (name, len(prefix), thinking)


def test_matches_the_official_template(jinja_render: Callable[..., str]) -> None:
    r = IncrementalRenderer()
    msgs = _loop(6)
    for n in range(2, len(msgs) + 1):
        expected = jinja_render("think", normalize_messages(msgs[:n]), TOOLS, True, None)
        assert r.render(msgs[:n], TOOLS, None).text == unicodedata.normalize("NFC", expected)


def test_extension_renders_only_new_messages() -> None:
    r = IncrementalRenderer()
    msgs = _loop(20)
    r.render(msgs[:-2], TOOLS, None)
    r.render(msgs, TOOLS, None)
    assert r.reused == len(msgs) - 3  # the two new messages and the last shared one (tool neighbour)
    r.render(msgs, TOOLS, None)  # a retry reuses all but the last
    assert r.reused == len(msgs) - 1


def test_new_user_query_re_renders_the_turns_it_strips() -> None:
    r = IncrementalRenderer()
    msgs = _loop(5)
    first = r.render(msgs, TOOLS, None).text
    assert "<think>\nstep 3\n</think>" in first
    nxt = [*msgs, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Now again."}]
    got = r.render(nxt, TOOLS, None).text
    assert got == full(nxt, TOOLS, None) and "step 3" not in got
    assert r.render(msgs, TOOLS, None).text == first  # and back (a branch from the earlier request)


def test_equal_but_differently_rendered_messages_are_re_rendered() -> None:
    """``==`` holds for reordered dict keys and for 1 / 1.0 / True; the rendering differs."""
    r = IncrementalRenderer()
    base = [{"role": "user", "content": "go"}]
    variants = [
        {"city": "Paris", "days": 1},
        {"days": 1, "city": "Paris"},
        {"days": 1.0, "city": "Paris"},
        {"days": True, "city": "Paris"},
    ]
    for args in variants + variants[::-1]:
        msgs: list[dict[str, Any]] = [*base]
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call("get_weather", args)]})
        msgs.append({"role": "tool", "content": "sunny"})
        assert r.render(msgs, TOOLS, None).text == full(msgs, TOOLS, None)
    for text in ("1", 1, 1.0, True):
        msgs = [
            {"role": "user", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": "x"},
        ]
        assert r.render(msgs, None, None).text == full(msgs, None, None)


def test_object_arguments_seen_before_are_not_re_rendered() -> None:
    """Anthropic Messages sends every tool call's input as an object: the same ``repr`` reuses its
    piece (the cost of a turn stays flat), a changed one (1 -> 1.0, key order) is re-rendered."""
    r = IncrementalRenderer()
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in range(12):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"days": turn})]})
        msgs.append({"role": "tool", "content": f"sunny {turn}"})
        fresh = copy.deepcopy(msgs)  # a new request: new objects, equal values
        assert r.render(fresh, TOOLS, None).text == full(fresh, TOOLS, None)
        if turn > 1:
            assert r.reused == len(msgs) - 3  # only the last shared message and the new two
    msgs[3]["tool_calls"][0]["function"]["arguments"] = {"days": 1.0}
    assert r.render(msgs, TOOLS, None).text == full(msgs, TOOLS, None)
    assert r.reused == len(msgs) - 2  # that message (and the last) again


def test_callers_may_mutate_their_messages() -> None:
    r = IncrementalRenderer()
    msgs = _loop(3)
    r.render(msgs, TOOLS, None)
    msgs[3]["content"] = "changed in place"
    msgs[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"cmd": "rm"})
    assert r.render(msgs, TOOLS, None).text == full(msgs, TOOLS, None)


def test_interleaved_conversations_are_both_cached() -> None:
    r = IncrementalRenderer()
    main, sub = _loop(8), copy.deepcopy(_loop(8))
    sub[0]["content"] = "You are a subagent."
    for n in range(4, 18, 2):
        for conv in (main, sub):
            assert r.render(conv[:n], TOOLS, False).text == full(conv[:n], TOOLS, False)
            if n > 4:
                assert r.reused == n - 3


def test_errors_raise_and_leave_the_cache_usable() -> None:
    r = IncrementalRenderer()
    msgs = _loop(2)
    good = r.render(msgs, TOOLS, None).text
    with pytest.raises(TemplateError, match="System message must be at the beginning"):
        r.render([*msgs, {"role": "system", "content": "late"}], TOOLS, None)
    with pytest.raises(TemplateError, match="No user query"):
        r.render([{"role": "assistant", "content": "hi"}], None, None)
    with pytest.raises(TemplateError, match="No messages"):
        r.render([], None, None)
    assert r.render(msgs, TOOLS, None).text == good


def test_non_ascii_text_is_nfc_normalised_per_piece() -> None:
    r = IncrementalRenderer()
    msgs = [{"role": "user", "content": "cafe\u0301 \u212b"}, {"role": "assistant", "content": "e\u0301"}]
    msgs.append({"role": "user", "content": "\u0301 starts with a combining mark"})
    for n in (1, 2, 3):
        assert r.render(msgs[:n], None, None).text == full(msgs[:n], None, None)


def test_values_without_boolean_equality_are_rendered_fully() -> None:
    class Ambiguous:
        """Like a numpy array: ``==`` returns something that has no truth value."""

        def __eq__(self, other: object) -> Any:
            return self

        def __bool__(self) -> bool:
            raise ValueError("truth value is ambiguous")

        def __str__(self) -> str:
            return "[1 2]"

    r = IncrementalRenderer()
    for _ in range(2):  # a new instance each time: == must be called (no identity shortcut)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call("bash", {"cmd": Ambiguous()})]})
        msgs.append({"role": "tool", "content": "ok"})
        assert r.render(msgs, TOOLS, None).text == full(msgs, TOOLS, None)


class UncachedQwen35(Qwen35Profile):
    """Qwen3.5 with the default renderer of other profiles (whole conversation every time)."""

    def prompt_renderer(self) -> PromptRenderer:
        return FullRenderer(self)


def test_segment_index_plans_equal_with_and_without_the_cache(qwen_tok: Tokenizer) -> None:
    cached = SegmentIndex(Qwen35Profile(tokenizer=qwen_tok))
    uncached = SegmentIndex(UncachedQwen35(tokenizer=qwen_tok))
    msgs = _loop(6)
    requests = [msgs[:n] for n in range(2, len(msgs) + 1, 2)]
    requests += [msgs[:4], [*msgs, {"role": "user", "content": "And now?"}]]  # a branch, a new query
    routes: list[str] = []
    for i, req in enumerate(requests):
        a, b = cached.plan(req, TOOLS), uncached.plan(req, TOOLS)
        assert (a.route, a.prompt_text, a.header_len, a.delta_ids, a.prompt_ids, a.boundary_reason) == (
            b.route, b.prompt_text, b.header_len, b.delta_ids, b.prompt_ids, b.boundary_reason
        )  # fmt: skip
        assert list(a.prompt) == a.prompt_ids and a.prompt_len == len(a.prompt_ids)
        routes.append(a.route)
        reply = msgs[len(req)] if len(req) < len(msgs) else {"role": "assistant", "content": "Done."}
        out = render_qwen35([*req, reply], TOOLS, add_generation_prompt=False)[len(a.prompt_text) : -1]
        gen = qwen_tok.encode(out)  # what a well-behaved model generates (ends with <|im_end|>)
        cached.record(a, f"t{i}", gen)
        uncached.record(b, f"t{i}", gen)
    assert routes == ["create", *["append"] * 6, "branch", "create"]


def test_prompt_ids_view() -> None:
    prefix = [1, 2, 3, 4]
    view = PromptIds(prefix, 3, (7, 8))
    prefix.append(5)  # segments grow; the view keeps its length
    assert len(view) == 5 and list(view) == view.tolist() == [1, 2, 3, 7, 8]
    assert [*view, 9] == [1, 2, 3, 7, 8, 9]
    assert (view[0], view[3], view[-1], view[1:4]) == (1, 7, 8, [2, 3, 7])
    with pytest.raises(IndexError):
        view[5]
