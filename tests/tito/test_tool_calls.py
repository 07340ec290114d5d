"""Parsing Qwen3.5 output into reasoning, content and OpenAI tool calls."""

from __future__ import annotations

import json

from dressage.tito.chat_template import normalize_messages, render_tool_calls
from dressage.tito.profiles import get_profile, profile_names
from dressage.tito.qwen_profile import Qwen35Profile
from dressage.tito.tool_calls import convert_value, parse_assistant_text, tool_call_id
from tests.tito.corpus import TOOLS

CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"


def test_reasoning_content_and_calls() -> None:
    text = f"Let me check.\n</think>\n\nChecking now.\n\n{CALL}\n{CALL.replace('Paris', 'Rome')}<|im_end|>"
    p = parse_assistant_text(text.removesuffix("<|im_end|>"), tools=TOOLS, seed="turn-1")
    assert p.reasoning_content == "Let me check."
    assert p.content == "Checking now."
    assert [json.loads(c["function"]["arguments"]) for c in p.tool_calls] == [
        {"city": "Paris", "days": 3},
        {"city": "Rome", "days": 3},
    ]
    assert p.tool_calls[1]["id"] == tool_call_id("turn-1", 1) and p.tool_calls[0]["type"] == "function"
    assert not p.failures
    assert p.to_message()["content"] == "Checking now."


def test_schema_types_and_json() -> None:
    assert convert_value("3", "string") == "3"
    assert convert_value("3", "integer") == 3
    assert convert_value("True", "boolean") is True
    assert convert_value('{"a": [1, 2]}', "object") == {"a": [1, 2]}
    assert convert_value("true") == "true"  # no schema: keep text unless JSON re-renders identically
    assert convert_value("12") == 12
    assert convert_value('{"a": 1}') == {"a": 1}
    assert convert_value("hello world") == "hello world"


def test_malformed_never_raises() -> None:
    cases = {
        "<tool_call>\n<function=x>\n<parameter=a>\n1\n</parameter>\n": "unclosed_tool_call",
        "<tool_call>\nno function here\n</tool_call>": "missing_function",
        "<tool_call>\n<function=x>\njunk\n</function>\n</tool_call>": "malformed_parameters",
    }
    for text, reason in cases.items():
        p = parse_assistant_text(text, think_open=False)
        assert p.tool_calls == [] and [f.reason for f in p.failures] == [reason]
        assert text in p.content


def test_multiline_and_tricky_values_round_trip() -> None:
    args = {"cmd": "echo \"a\"\nprintf '</parameter>' done", "env": {"K": [1, None]}, "n": 2, "s": "true"}
    msg = normalize_messages(
        [{"role": "assistant", "tool_calls": [{"function": {"name": "bash", "arguments": json.dumps(args)}}]}]
    )[0]
    xml = render_tool_calls(msg["tool_calls"], "")
    p = parse_assistant_text(xml, think_open=False)
    assert json.loads(p.tool_calls[0]["function"]["arguments"]) == args
    assert p.content == "" and p.to_message()["content"] is None


def test_no_think_and_truncated_think() -> None:
    assert parse_assistant_text("plain", think_open=False).reasoning_content is None
    p = parse_assistant_text("still thinking...", think_open=True)
    assert (p.reasoning_content, p.content) == ("still thinking...", "")


def test_profiles(qwen_tok) -> None:  # type: ignore[no-untyped-def]
    assert {"qwen3.5", "qwen3.5-nothink"} <= set(profile_names())
    think, nothink = get_profile("qwen3.5"), get_profile("qwen3.5-nothink")
    assert think.generation_prompt_suffix() == "<|im_start|>assistant\n<think>\n"
    assert nothink.generation_prompt_suffix() == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert think.template_hash != nothink.template_hash
    p = Qwen35Profile(tokenizer=qwen_tok)
    assert (p.im_start_id, p.im_end_id, p.eos_id) == (248045, 248046, 248044)
    assert p.stop_token_ids == (248046, 248044)
    assert p.parse_assistant("r</think>\n\nok").content == "ok"
