"""The dialects' typed request schemas refuse bad requests with the messages the hand-written checks gave.

Each row patches a valid request (``DROP`` removes the field) and pins the :class:`RequestError`'s
message, ``param`` and ``code`` (chat completions, Anthropic Messages, OpenAI Responses): they were read off the hand-written parsers (commit f4f6fef) the
schemas replaced (issue 37, point 4), so a client sees the same 400s. The HTTP shape of these errors
is tested with the dialects (``test_dialects.py``, ``test_chat_breadth.py``).
"""

from __future__ import annotations

import copy
from typing import cast

import orjson
import pytest

from dressage.errors import RequestError
from dressage.proxy.conversation import Conversation
from dressage.proxy.dialects.chat import parse_chat_request
from dressage.proxy.dialects.messages import parse_count_tokens_request, parse_messages_request
from dressage.proxy.dialects.responses import ResponsesDialect
from dressage.proxy.sessions import SessionState
from dressage.tito import get_profile


def _patched(base: dict[str, object], patch: dict[str, object]) -> bytes:
    body = copy.deepcopy(base)
    for key, value in patch.items():
        if value == "DROP":
            body.pop(key, None)
        else:
            body[key] = value
    return orjson.dumps(body)


CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "reasoning": "r",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "x"}], "name": "f"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
}  # fmt: skip

CHAT_REFUSALS = [
    ({"messages": "DROP"}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": []}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": "x"}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": [3]}, "messages[0] must be an object", "messages[0]", "invalid_type"),
    (
        {"messages": [{"content": "x"}]},
        "messages[0].role must be one of system, developer, user, assistant, tool, got None",
        "messages[0].role",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "bot", "content": "x"}]},
        "messages[0].role must be one of system, developer, user, assistant, tool, got 'bot'",
        "messages[0].role",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content must be a string or an array of parts",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "user", "content": {"a": 1}}]},
        "messages[0].content must be a string or an array of parts",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "assistant", "content": "x", "tool_calls": {}}]},
        "messages[0].tool_calls must be an array",
        "messages[0].tool_calls",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "system", "content": "s"}, {"role": 3}]},
        "messages[1].role must be one of system, developer, user, assistant, tool, got 3",
        "messages[1].role",
        "invalid_value",
    ),
    ({"tools": "x"}, "'tools' must be an array", "tools", "invalid_type"),
    (
        {"tools": [3]},
        "tools[0] must be {'type': 'function', 'function': {'name': ...}}",
        "tools[0]",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "web"}]},
        "tools[0] must be {'type': 'function', 'function': {'name': ...}}",
        "tools[0]",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function"}]},
        "tools[0] must be {'type': 'function', 'function': {'name': ...}}",
        "tools[0]",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": ""}}]},
        "tools[0].function.name must be a non-empty string",
        "tools[0].function.name",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "function": {}}]},
        "tools[0].function.name must be a non-empty string",
        "tools[0].function.name",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
        "tools[0].function.description must be a string",
        "tools[0].function.description",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
        "tools[0].function parameters must be a JSON Schema object, got list",
        "tools[0].function",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "s"}}]},
        "tools[0].function parameters must be a JSON Schema object, got str",
        "tools[0].function",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "function", "function": "f"}]},
        "tools[0] must be {'type': 'function', 'function': {'name': ...}}",
        "tools[0]",
        "invalid_value",
    ),
    (
        {"tools": [{"type": None, "function": {"name": "f"}}]},
        "tools[0] must be {'type': 'function', 'function': {'name': ...}}",
        "tools[0]",
        "invalid_value",
    ),
    (
        {"tool_choice": "any"},
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, got 'any'",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": 3},
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, got 3",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice names function 'g', which is not in the tools (f)",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "function"}},
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, got {'type': 'function'}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "function", "function": {"name": 3}}},
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, got {'type': 'function', 'function': {'name': 3}}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": "required", "tools": "DROP"},
        "tool_choice 'required' needs a non-empty tools array",
        "tool_choice",
        "invalid_value",
    ),
    ({"stream": "yes"}, "'stream' must be a boolean", "stream", "invalid_type"),
    ({"stream": 1}, "'stream' must be a boolean", "stream", "invalid_type"),
    (
        {"stream_options": {"include_usage": True}},
        "'stream_options' is only allowed when 'stream' is true",
        "stream_options",
        "invalid_value",
    ),
    (
        {"stream_options": 3, "stream": True},
        "'stream_options' must be an object",
        "stream_options",
        "invalid_type",
    ),
    (
        {"stream_options": {"continuous_usage_stats": True}, "stream": True},
        "usage in every chunk is not supported by this proxy",
        "stream_options.continuous_usage_stats",
        "unsupported_parameter",
    ),
    ({"logprobs": "x"}, "'logprobs' must be a boolean", "logprobs", "invalid_type"),
    ({"top_logprobs": 5}, "'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value"),
    (
        {"logprobs": True, "top_logprobs": 21},
        "'top_logprobs' must be between 0 and 20, got 21",
        "top_logprobs",
        "invalid_value",
    ),
    (
        {"logprobs": True, "top_logprobs": 2.5},
        "'top_logprobs' must be an integer, got 2.5",
        "top_logprobs",
        "invalid_type",
    ),
    (
        {"logprobs": True, "top_logprobs": True},
        "'top_logprobs' must be an integer, got True",
        "top_logprobs",
        "invalid_type",
    ),
    ({"n": 0}, "'n' must be between 1 and 16, got 0", "n", "invalid_value"),
    ({"n": 17}, "'n' must be between 1 and 16, got 17", "n", "invalid_value"),
    ({"n": "2"}, "'n' must be an integer, got '2'", "n", "invalid_type"),
    ({"n": 2.0}, "'n' must be an integer, got 2.0", "n", "invalid_type"),
    ({"model": 3}, "'model' must be a string", "model", "invalid_type"),
    ({"temperature": 3}, "'temperature' must be between 0.0 and 2.0, got 3", "temperature", "invalid_value"),
    (
        {"temperature": -0.1},
        "'temperature' must be between 0.0 and 2.0, got -0.1",
        "temperature",
        "invalid_value",
    ),
    ({"temperature": "1"}, "'temperature' must be a number, got '1'", "temperature", "invalid_type"),
    ({"temperature": True}, "'temperature' must be a number, got True", "temperature", "invalid_type"),
    ({"top_p": 0}, "'top_p' must be greater than 0", "top_p", "invalid_value"),
    ({"top_p": 0.0}, "'top_p' must be greater than 0", "top_p", "invalid_value"),
    ({"top_p": 1.5}, "'top_p' must be between 0.0 and 1.0, got 1.5", "top_p", "invalid_value"),
    ({"min_p": 2}, "'min_p' must be between 0.0 and 1.0, got 2", "min_p", "invalid_value"),
    ({"top_k": 0}, "'top_k' must be -1 (all) or at least 1", "top_k", "invalid_value"),
    ({"top_k": -2}, "'top_k' must be between -1 and 1048576, got -2", "top_k", "invalid_value"),
    ({"top_k": 1.5}, "'top_k' must be an integer, got 1.5", "top_k", "invalid_type"),
    ({"top_k": 2097152}, "'top_k' must be between -1 and 1048576, got 2097152", "top_k", "invalid_value"),
    (
        {"seed": 9223372036854775808},
        "'seed' must be between -9223372036854775808 and 9223372036854775807, got 9223372036854775808",
        "seed",
        "invalid_value",
    ),
    ({"seed": "x"}, "'seed' must be an integer, got 'x'", "seed", "invalid_type"),
    (
        {"frequency_penalty": 3},
        "'frequency_penalty' must be between -2.0 and 2.0, got 3",
        "frequency_penalty",
        "invalid_value",
    ),
    (
        {"presence_penalty": "a"},
        "'presence_penalty' must be a number, got 'a'",
        "presence_penalty",
        "invalid_type",
    ),
    (
        {"repetition_penalty": 0},
        "'repetition_penalty' must be in (0, 2] (1 = none)",
        "repetition_penalty",
        "invalid_value",
    ),
    (
        {"repetition_penalty": 2.5},
        "'repetition_penalty' must be between 0.0 and 2.0, got 2.5",
        "repetition_penalty",
        "invalid_value",
    ),
    ({"stop": ""}, "'stop' must be a non-empty string or an array of up to 4", "stop", "invalid_value"),
    (
        {"stop": ["a", ""]},
        "'stop' must be a non-empty string or an array of up to 4",
        "stop",
        "invalid_value",
    ),
    (
        {"stop": ["a", "a", "a", "a", "a"]},
        "'stop' must be a non-empty string or an array of up to 4",
        "stop",
        "invalid_value",
    ),
    ({"stop": 3}, "'stop' must be a non-empty string or an array of up to 4", "stop", "invalid_value"),
    (
        {"response_format": 3},
        "'response_format' must be an object with a 'type'",
        "response_format",
        "invalid_type",
    ),
    (
        {"response_format": {}},
        "'response_format' must be an object with a 'type'",
        "response_format",
        "invalid_type",
    ),
    (
        {"response_format": {"type": "json_schema"}},
        "response_format json_schema needs 'json_schema.schema' (a JSON Schema object)",
        "response_format.json_schema.schema",
        "invalid_value",
    ),
    (
        {"response_format": {"type": "structural_tag"}},
        "response_format 'structural_tag' is not supported by this proxy",
        "response_format",
        "unsupported_parameter",
    ),
    (
        {"response_format": {"type": "xml"}},
        "response_format.type must be text, json_object or json_schema, got 'xml'",
        "response_format.type",
        "invalid_value",
    ),
    ({"regex": ""}, "'regex' must be a non-empty string", "regex", "invalid_type"),
    ({"regex": 3}, "'regex' must be a non-empty string", "regex", "invalid_type"),
    (
        {"regex": "a", "ebnf": "b"},
        "only one output constraint may be set, got regex, ebnf",
        "ebnf",
        "invalid_value",
    ),
    (
        {"structured_outputs": {"json": "{bad"}},
        "'structured_outputs.json' is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "structured_outputs.json",
        "invalid_value",
    ),
    (
        {"structured_outputs": {"choice": []}},
        "'structured_outputs.choice' must be a non-empty array of non-empty strings",
        "structured_outputs.choice",
        "invalid_value",
    ),
    (
        {"structured_outputs": {"grammar": ""}},
        "'structured_outputs.grammar' must be a non-empty string",
        "structured_outputs.grammar",
        "invalid_type",
    ),
    (
        {"structured_outputs": {"foo": 1}},
        "structured_outputs.foo is not supported (use json, regex, choice, grammar) by this proxy",
        "structured_outputs.foo",
        "unsupported_parameter",
    ),
    (
        {"structured_outputs": {}},
        "'structured_outputs' must set exactly one of choice, grammar, json, json_object, regex",
        "structured_outputs",
        "invalid_value",
    ),
    (
        {"structured_outputs": 3},
        "'structured_outputs' must be an object",
        "structured_outputs",
        "invalid_type",
    ),
    (
        {"regex": "a", "tool_choice": "required"},
        "tool_choice 'required' or a named tool cannot be combined with regex: the tool-call constraint and the output constraint cannot both be honoured",
        "regex",
        "invalid_value",
    ),
    (
        {"response_format": {"type": "json_object"}, "regex": "a"},
        "only one output constraint may be set, got response_format, regex",
        "regex",
        "invalid_value",
    ),
    ({"max_tokens": 0}, "'max_tokens' must be between 1 and 16777216, got 0", "max_tokens", "invalid_value"),
    ({"max_tokens": "5"}, "'max_tokens' must be an integer, got '5'", "max_tokens", "invalid_type"),
    (
        {"max_completion_tokens": 0},
        "'max_completion_tokens' must be between 1 and 16777216, got 0",
        "max_completion_tokens",
        "invalid_value",
    ),
    (
        {"max_completion_tokens": 33554432},
        "'max_completion_tokens' must be between 1 and 16777216, got 33554432",
        "max_completion_tokens",
        "invalid_value",
    ),
    (
        {"chat_template_kwargs": {"enable_thinking": "yes"}},
        "enable_thinking must be a boolean",
        "chat_template_kwargs.enable_thinking",
        "invalid_type",
    ),
    (
        {"chat_template_kwargs": 3},
        "'chat_template_kwargs' must be an object",
        "chat_template_kwargs",
        "invalid_type",
    ),
    (
        {"audio": {"voice": "x"}},
        "audio output is not supported by this proxy",
        "audio",
        "unsupported_parameter",
    ),
    (
        {"functions": [{"name": "f"}]},
        "legacy 'functions' is not supported; use 'tools' by this proxy",
        "functions",
        "unsupported_parameter",
    ),
    (
        {"logit_bias": {"1": 2}},
        "logit_bias is not supported by this proxy",
        "logit_bias",
        "unsupported_parameter",
    ),
    (
        {"modalities": ["audio"]},
        "only the 'text' modality is supported by this proxy",
        "modalities",
        "unsupported_parameter",
    ),
    (
        {"web_search_options": {"a": 1}},
        "web search is not supported by this proxy",
        "web_search_options",
        "unsupported_parameter",
    ),
]


@pytest.mark.parametrize(("patch", "message", "param", "code"), CHAT_REFUSALS)
def test_chat_refusals_keep_their_words(
    patch: dict[str, object], message: str, param: str, code: str
) -> None:
    with pytest.raises(RequestError) as refused:
        parse_chat_request(_patched(CHAT, patch))
    assert (str(refused.value), refused.value.param, refused.value.code) == (message, param, code)


def test_chat_schema_keeps_what_the_template_reads() -> None:
    """Extra message keys pass through, ``reasoning`` becomes ``reasoning_content``, unknown fields are recorded."""
    extra = {"foo": 1, "user": "u", "temperature": 1, "stop": "x", "presence_penalty": 0, "repetition_penalty": 1.0,
             "chat_template_kwargs": {"enable_thinking": True, "other": 1}, "n": 2}  # fmt: skip
    conv = parse_chat_request(_patched(CHAT, extra))
    assistant = conv.messages[2]
    assert assistant["reasoning_content"] == "r" and assistant["reasoning"] == "r"
    assert conv.messages[3]["name"] == "f" and conv.messages[3]["content"] == [{"type": "text", "text": "x"}]
    assert conv.tools == CHAT["tools"] and conv.parse_tools and conv.force_tool is None
    assert conv.ignored == ["foo"] and conv.enable_thinking is True and conv.n == 2
    assert conv.sampling == {"temperature": 1.0, "stop": ["x"]} and isinstance(
        conv.sampling["temperature"], float
    )


_USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "text", "text": "r"}],
            "is_error": False,
        },
        {"type": "tool_result", "tool_use_id": "t2"},
        {"type": "text", "text": "c"},
    ],
}
_ASSISTANT = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"},
        {"type": "text", "text": "x"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
    ],
}
MESSAGES = {
    "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys", "cache_control": {}}],
    "messages": [{"role": "user", "content": "hi"}, _ASSISTANT, _USER, {"role": "system", "content": "late"},
                 {"role": "assistant", "content": "ok"}],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}, "cache_control": {}}],
}  # fmt: skip


MESSAGES_REFUSALS = [
    (
        {"foo": 1, "bar": 2},
        "unknown parameter(s) bar, foo for the Anthropic Messages API are not supported by this proxy",
        "bar",
        "unknown_parameter",
    ),
    ({"messages": "DROP"}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": []}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": "x"}, "'messages' must be a non-empty array", "messages", "invalid_type"),
    ({"messages": [3]}, "messages[0] must be an object", "messages[0]", "invalid_type"),
    (
        {"messages": [{"content": "x"}]},
        "messages[0].role must be user, assistant or system, got None",
        "messages[0].role",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "bot", "content": "x"}]},
        "messages[0].role must be user, assistant or system, got 'bot'",
        "messages[0].role",
        "invalid_value",
    ),
    (
        {"messages": [{"role": 3}]},
        "messages[0].role must be user, assistant or system, got 3",
        "messages[0].role",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user"}]},
        "messages[0].content must be a string or an array of blocks",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content must be a string or an array of blocks",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "assistant", "content": {"a": 1}}]},
        "messages[0].content must be a string or an array of blocks",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "system", "content": 5}]},
        "messages[0].content must be a string or an array of text parts",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "system"}]},
        "messages[0].content must be a string or an array of text parts",
        "messages[0].content",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "system", "content": [{"type": "image"}]}]},
        "messages[0].content[0] must be a text block, got 'image'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "system", "content": [3]}]},
        "messages[0].content[0] must be a text block, got 'int'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "system", "content": [{"type": "text"}]}]},
        "messages[0].content[0] must be a text part with a string 'text'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "system", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content[0] must be a text part with a string 'text'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [3]}]},
        "messages[0].content[0] has an unknown block type None",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"x": 1}]}]},
        "messages[0].content[0] has an unknown block type None",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
        "image blocks are not supported (text models only) by this proxy",
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
        "document blocks are not supported (text models only) by this proxy",
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "search_result"}]}]},
        "search_result blocks are not supported (text models only) by this proxy",
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
        "messages[0].content[0] has an unknown block type 'thinking'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0][0] must be a text part with a string 'text'",
        "messages[0].content[0][0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content[0][0] must be a text part with a string 'text'",
        "messages[0].content[0][0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        "messages[0].content[0].tool_use_id must be a string",
        "messages[0].content[0].tool_use_id",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}]},
        "messages[0].content[0].tool_use_id must be a string",
        "messages[0].content[0].tool_use_id",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]},
        "messages[0].content[0].tool_use_id must be a string",
        "messages[0].content[0].tool_use_id",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
            ]
        },
        "messages[0].content[0].content must be a string or an array of text parts",
        "messages[0].content[0].content",
        "invalid_type",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                }
            ]
        },
        "messages[0].content[0].content[0] must be a text block, got 'image'",
        "messages[0].content[0].content[0]",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [3]}]}
            ]
        },
        "messages[0].content[0].content[0] must be a text block, got 'int'",
        "messages[0].content[0].content[0]",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}],
                }
            ]
        },
        "messages[0].content[0].content[0] must be a text part with a string 'text'",
        "messages[0].content[0].content[0]",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}
            ]
        },
        "messages[0].content[0].is_error must be a boolean",
        "messages[0].content[0].is_error",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "assistant", "content": [3]}]},
        "messages[0].content[0] has an unknown block type None",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
        "redacted_thinking blocks (another provider's encrypted reasoning) are not supported by this proxy",
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "image"}]}]},
        "messages[0].content[0] has an unknown block type 'image'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
        "messages[0].content[0] has an unknown block type 'tool_result'",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "thinking"}]}]},
        "messages[0].content[0].thinking must be a string",
        "messages[0].content[0].thinking",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 3}]}]},
        "messages[0].content[0].thinking must be a string",
        "messages[0].content[0].thinking",
        "invalid_type",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
        "messages[0].content[0] must have a string id and name and an object input",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": 3, "name": "f", "input": {}}]}
            ]
        },
        "messages[0].content[0] must have a string id and name and an object input",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}
            ]
        },
        "messages[0].content[0] must have a string id and name and an object input",
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "text", "text": None}]}]},
        "messages[0].content[0][0] must be a text part with a string 'text'",
        "messages[0].content[0][0]",
        "invalid_value",
    ),
    ({"system": 3}, "system must be a string or an array of text parts", "system", "invalid_type"),
    (
        {"system": [{"type": "image"}]},
        "system[0] must be a text block, got 'image'",
        "system[0]",
        "invalid_value",
    ),
    ({"system": [3]}, "system[0] must be a text block, got 'int'", "system[0]", "invalid_value"),
    (
        {"system": [{"type": "text", "text": 3}]},
        "system[0] must be a text part with a string 'text'",
        "system[0]",
        "invalid_value",
    ),
    ({"system": [{}]}, "system[0] must be a text part with a string 'text'", "system[0]", "invalid_value"),
    ({"tools": "x"}, "'tools' must be an array", "tools", "invalid_type"),
    ({"tools": [3]}, "tools[0] must be an object", "tools[0]", "invalid_type"),
    (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "server tool 'web_search_20250305' (run by Anthropic's servers) is not supported by this proxy",
        "tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": None, "name": "x"}]},
        "server tool None (run by Anthropic's servers) is not supported by this proxy",
        "tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"name": "f"}]},
        "tools[0].input_schema must be a JSON Schema object",
        "tools[0].input_schema",
        "invalid_type",
    ),
    (
        {"tools": [{"name": "f", "input_schema": []}]},
        "tools[0].input_schema must be a JSON Schema object",
        "tools[0].input_schema",
        "invalid_type",
    ),
    (
        {"tools": [{"name": "", "input_schema": {}}]},
        "tools[0].name must be a non-empty string",
        "tools[0].name",
        "invalid_value",
    ),
    (
        {"tools": [{"input_schema": {}}]},
        "tools[0].name must be a non-empty string",
        "tools[0].name",
        "invalid_value",
    ),
    (
        {"tools": [{"name": "f", "input_schema": {}, "description": 3}]},
        "tools[0].description must be a string",
        "tools[0].description",
        "invalid_type",
    ),
    (
        {"tool_choice": {"type": "tool", "name": "g"}},
        "tool_choice.name names function 'g', which is not in the tools (f)",
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "tool"}},
        "tool_choice.name names function None, which is not in the tools (f)",
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "tool", "name": 3}},
        "tool_choice.name names function 3, which is not in the tools (f)",
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tool_choice": "auto"},
        "tool_choice must be {'type': 'auto' | 'any' | 'tool' | 'none'}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "bad"}},
        "tool_choice must be {'type': 'auto' | 'any' | 'tool' | 'none'}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "any"}, "tools": "DROP"},
        "tool_choice.name 'required' needs a non-empty tools array",
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"output_config": {"effort": "huge"}},
        "output_config.effort must be 'low', 'medium', 'high', 'xhigh' or 'max'",
        "output_config.effort",
        "invalid_value",
    ),
    (
        {"output_config": {"format": {}}},
        "unknown parameter(s) format for the Anthropic Messages output_config API are not supported by this proxy",
        "format",
        "unknown_parameter",
    ),
    ({"output_config": 3}, "'output_config' must be an object", "output_config", "invalid_type"),
    (
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        "context edit 'clear_tool_uses_20250919' is not supported (only clear_thinking_* edits, which the template's reasoning rendering already covers, are accepted) by this proxy",
        "context_management.edits[0].type",
        "unsupported_parameter",
    ),
    (
        {"context_management": 3},
        "'context_management' must be {'edits': [objects]}",
        "context_management",
        "invalid_type",
    ),
    (
        {"context_management": {}},
        "'context_management' must be {'edits': [objects]}",
        "context_management",
        "invalid_type",
    ),
    (
        {"context_management": {"edits": [3]}},
        "'context_management' must be {'edits': [objects]}",
        "context_management",
        "invalid_type",
    ),
    ({"model": 3}, "'model' must be a string", "model", "invalid_type"),
    ({"max_tokens": "DROP"}, "'max_tokens' is required", "max_tokens", "missing_required_parameter"),
    ({"max_tokens": 0}, "'max_tokens' must be between 1 and 16777216, got 0", "max_tokens", "invalid_value"),
    ({"max_tokens": "5"}, "'max_tokens' must be an integer, got '5'", "max_tokens", "invalid_type"),
    ({"max_tokens": None}, "'max_tokens' is required", "max_tokens", "missing_required_parameter"),
    (
        {"max_tokens": 33554432},
        "'max_tokens' must be between 1 and 16777216, got 33554432",
        "max_tokens",
        "invalid_value",
    ),
    (
        {"temperature": 1.5},
        "'temperature' must be between 0.0 and 1.0, got 1.5",
        "temperature",
        "invalid_value",
    ),
    ({"temperature": "x"}, "'temperature' must be a number, got 'x'", "temperature", "invalid_type"),
    ({"top_p": 2}, "'top_p' must be between 0.0 and 1.0, got 2", "top_p", "invalid_value"),
    ({"top_k": 0}, "'top_k' must be between 1 and 1048576, got 0", "top_k", "invalid_value"),
    ({"top_k": 1.5}, "'top_k' must be an integer, got 1.5", "top_k", "invalid_type"),
    (
        {"stop_sequences": [""]},
        "'stop_sequences' must be an array of non-empty strings",
        "stop_sequences",
        "invalid_value",
    ),
    (
        {"stop_sequences": "a"},
        "'stop_sequences' must be an array of non-empty strings",
        "stop_sequences",
        "invalid_value",
    ),
    (
        {"stop_sequences": [3]},
        "'stop_sequences' must be an array of non-empty strings",
        "stop_sequences",
        "invalid_value",
    ),
    ({"stream": "x"}, "'stream' must be a boolean", "stream", "invalid_type"),
    (
        {"thinking": {"type": "on"}},
        "thinking must be {'type': 'enabled' | 'adaptive' | 'disabled'}",
        "thinking.type",
        "invalid_value",
    ),
    (
        {"thinking": 3},
        "thinking must be {'type': 'enabled' | 'adaptive' | 'disabled'}",
        "thinking.type",
        "invalid_value",
    ),
    (
        {"thinking": {}},
        "thinking must be {'type': 'enabled' | 'adaptive' | 'disabled'}",
        "thinking.type",
        "invalid_value",
    ),
    (
        {"thinking": {"type": "enabled", "budget_tokens": "x"}},
        "'budget_tokens' must be an integer, got 'x'",
        "budget_tokens",
        "invalid_type",
    ),
    (
        {"thinking": {"type": "enabled", "budget_tokens": -1}},
        "'budget_tokens' must be between 0 and 16777216, got -1",
        "budget_tokens",
        "invalid_value",
    ),
    (
        {"thinking": {"type": "enabled", "foo": 1}},
        "unknown parameter(s) foo for the Anthropic Messages thinking API are not supported by this proxy",
        "foo",
        "unknown_parameter",
    ),
]


@pytest.mark.parametrize(("patch", "message", "param", "code"), MESSAGES_REFUSALS)
def test_messages_refusals_keep_their_words(
    patch: dict[str, object], message: str, param: str, code: str
) -> None:
    with pytest.raises(RequestError) as refused:
        parse_messages_request(_patched(MESSAGES, patch))
    assert (str(refused.value), refused.value.param, refused.value.code) == (message, param, code)


def test_messages_schema_builds_the_template_messages() -> None:
    """Blocks become the chat template's messages: text runs merged, tool results as tool messages, system hoisted."""
    conv = parse_messages_request(
        _patched(MESSAGES, {"metadata": {"user_id": "u"}, "temperature": 1, "stop_sequences": []})
    )
    assert conv.messages == [
        {"role": "system", "content": "sys\n\nlate"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x", "reasoning_content": "hm",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "user", "content": "ab"},
        {"role": "tool", "tool_call_id": "t1", "content": "r"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip
    assert conv.tools == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    assert conv.sampling == {"temperature": 1.0} and conv.ignored == ["metadata"] and conv.max_tokens == 10


def test_count_tokens_takes_the_conversation_fields_only() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with pytest.raises(
        RequestError, match="unknown parameter\\(s\\) max_tokens for the Anthropic count_tokens API"
    ):
        parse_count_tokens_request(orjson.dumps(body))
    del body["max_tokens"]
    assert parse_count_tokens_request(orjson.dumps(body)).messages == [{"role": "user", "content": "hi"}]


_ITEMS = [
    {"type": "message", "role": "user", "content": "hi"},
    {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x", "annotations": []}],
    },
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "f",
        "arguments": "{}",
        "id": "fc1",
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "c1", "output": "out"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "o2"}]},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "rt"}]},
    {"type": "reasoning", "encrypted_content": "aGVsbG8="},
    {"role": "assistant", "content": "y"},
]
RESPONSES = {
    "model": "m", "instructions": "sys", "input": _ITEMS, "store": False,
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False},
              {"type": "web_search"},
              {"type": "namespace", "name": "mcp__x", "tools": [{"type": "function", "name": "g"}, {"name": "h", "parameters": {}}]}],
}  # fmt: skip

RESPONSES_REFUSALS = [
    ({"store": "x"}, "'store' must be a boolean", "store", "invalid_type"),
    (
        {"foo": 1},
        "unknown parameter(s) foo for the OpenAI Responses API are not supported by this proxy",
        "foo",
        "unknown_parameter",
    ),
    ({"input": "DROP"}, "'input' must be a string or an array of items", "input", "invalid_type"),
    ({"input": 3}, "'input' must be a string or an array of items", "input", "invalid_type"),
    ({"input": None}, "'input' must be a string or an array of items", "input", "invalid_type"),
    ({"input": {}}, "'input' must be a string or an array of items", "input", "invalid_type"),
    ({"input": [3]}, "input[0] must be an object", "input[0]", "invalid_type"),
    (
        {"input": [{"type": "image"}]},
        "input item type 'image' is not supported by this proxy",
        "input[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": "message", "role": "user"}]},
        "input[0].content must be a string or an array of text parts",
        "input[0].content",
        "invalid_type",
    ),
    (
        {"input": [{"role": "user", "content": 3}]},
        "input[0].content must be a string or an array of text parts",
        "input[0].content",
        "invalid_type",
    ),
    (
        {"input": [{"role": "bot", "content": "x"}]},
        "input[0].role must be user, assistant, system or developer, got 'bot'",
        "input[0].role",
        "invalid_value",
    ),
    (
        {"input": [{"content": "x"}]},
        "input[0].role must be user, assistant, system or developer, got None",
        "input[0].role",
        "invalid_value",
    ),
    (
        {"input": [{"role": 3, "content": 3}]},
        "input[0].content must be a string or an array of text parts",
        "input[0].content",
        "invalid_type",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "content part 'input_image' is not supported (text models only) by this proxy",
        "input[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"role": "user", "content": [3]}]},
        "content part None is not supported (text models only) by this proxy",
        "input[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        "input[0].content[0] must be a text part with a string 'text'",
        "input[0].content[0]",
        "invalid_value",
    ),
    (
        {"input": [{"role": "user", "content": [{"text": "x"}]}]},
        "content part None is not supported (text models only) by this proxy",
        "input[0].content[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "input[0].content[0] must be a text part with a string 'text'",
        "input[0].content[0]",
        "invalid_value",
    ),
    (
        {"input": [{"type": "function_call", "call_id": "c"}]},
        "input[0] must have string call_id, name and arguments",
        "input[0]",
        "invalid_value",
    ),
    (
        {"input": [{"type": "function_call", "call_id": 3, "name": "f", "arguments": "{}"}]},
        "input[0] must have string call_id, name and arguments",
        "input[0]",
        "invalid_value",
    ),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
        "input[0] must have string call_id, name and arguments",
        "input[0]",
        "invalid_value",
    ),
    (
        {"input": [{"type": "function_call_output", "output": "x"}]},
        "input[0].call_id must be a string",
        "input[0].call_id",
        "invalid_value",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "c"}]},
        "input[0].output must be a string or an array of text parts",
        "input[0].output",
        "invalid_type",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
        "input[0].output must be a string or an array of text parts",
        "input[0].output",
        "invalid_type",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
        "content part 'input_image' is not supported (text models only) by this proxy",
        "input[0].output[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": "reasoning", "content": 3}]},
        "input[0].content must be a string or an array of text parts",
        "input[0].content",
        "invalid_type",
    ),
    (
        {"input": [{"type": "reasoning", "encrypted_content": "!!"}]},
        "input[0].encrypted_content was not written by this proxy",
        "input[0].encrypted_content",
        "invalid_value",
    ),
    (
        {"input": [{"type": "reasoning", "summary": [3]}]},
        "input[0].summary[0] must be a text part with a string 'text'",
        "input[0].summary[0]",
        "invalid_value",
    ),
    (
        {"input": [{"type": "item_reference", "id": "x"}]},
        "input item type 'item_reference' is not supported by this proxy",
        "input[0]",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": None}]},
        "input item type None is not supported by this proxy",
        "input[0]",
        "unsupported_parameter",
    ),
    (
        {"instructions": 3},
        "instructions must be a string or an array of text parts",
        "instructions",
        "invalid_type",
    ),
    (
        {"instructions": [3]},
        "instructions[0] must be a text part with a string 'text'",
        "instructions[0]",
        "invalid_value",
    ),
    (
        {"instructions": [{"type": "x"}]},
        "instructions[0] must be a text part with a string 'text'",
        "instructions[0]",
        "invalid_value",
    ),
    ({"tools": "x"}, "'tools' must be an array", "tools", "invalid_type"),
    ({"tools": [3]}, "tool type None is not supported by this proxy", "tools[0]", "unsupported_parameter"),
    (
        {"tools": [{"type": "custom", "name": "x"}]},
        "tool type 'custom' is not supported by this proxy",
        "tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"name": "f"}]},
        "tool type None is not supported by this proxy",
        "tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "function"}]},
        "tools[0].name must be a non-empty string",
        "tools[0].name",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "name": ""}]},
        "tools[0].name must be a non-empty string",
        "tools[0].name",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "name": "f", "description": 3}]},
        "tools[0].description must be a string",
        "tools[0].description",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "function", "name": "f", "parameters": []}]},
        "tools[0] parameters must be a JSON Schema object, got list",
        "tools[0]",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n"}]},
        "tools[0].tools must be an array",
        "tools[0].tools",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n", "tools": 3}]},
        "tools[0].tools must be an array",
        "tools[0].tools",
        "invalid_type",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n", "tools": [3]}]},
        "a namespace may hold only function tools here by this proxy",
        "tools[0].tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
        "a namespace may hold only function tools here by this proxy",
        "tools[0].tools[0]",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"name": ""}]}]},
        "tools[0].tools[0].name must be a non-empty string",
        "tools[0].tools[0].name",
        "invalid_value",
    ),
    (
        {"tool_choice": "any"},
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "function"}},
        "tool_choice.name names function None, which is not in the tools (f, g, h)",
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tool_choice": {"type": "x"}},
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"tool_choice": 3},
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
        "invalid_value",
    ),
    (
        {"reasoning": {"effort": "huge"}},
        "reasoning.effort 'huge' is not known",
        "reasoning.effort",
        "invalid_value",
    ),
    ({"reasoning": 3}, "'reasoning' must be an object", "reasoning", "invalid_type"),
    ({"truncation": "x"}, "'truncation' must be 'disabled' or 'auto'", "truncation", "invalid_value"),
    ({"truncation": 3}, "'truncation' must be 'disabled' or 'auto'", "truncation", "invalid_value"),
    ({"temperature": 3}, "'temperature' must be between 0.0 and 2.0, got 3", "temperature", "invalid_value"),
    ({"top_p": 2}, "'top_p' must be between 0.0 and 1.0, got 2", "top_p", "invalid_value"),
    ({"model": 3}, "'model' must be a string", "model", "invalid_type"),
    ({"stream": "x"}, "'stream' must be a boolean", "stream", "invalid_type"),
    (
        {"max_output_tokens": 0},
        "'max_output_tokens' must be between 1 and 16777216, got 0",
        "max_output_tokens",
        "invalid_value",
    ),
    (
        {"max_output_tokens": "5"},
        "'max_output_tokens' must be an integer, got '5'",
        "max_output_tokens",
        "invalid_type",
    ),
    (
        {"text": {"format": {"type": "json_schema"}}},
        "structured output formats are not supported by this proxy",
        "text.format",
        "unsupported_parameter",
    ),
    ({"include": ["x"]}, "include x is not supported by this proxy", "include", "unsupported_parameter"),
    ({"include": "x"}, "'include' must be an array of strings", "include", "invalid_type"),
    ({"include": [3]}, "'include' must be an array of strings", "include", "invalid_type"),
    (
        {"previous_response_id": 3},
        "'previous_response_id' must be a string",
        "previous_response_id",
        "invalid_type",
    ),
]


def _responses(patch: dict[str, object]) -> Conversation:
    """Parse with no session: only ``previous_response_id`` reads the session's stored chain, and
    these bodies never name a stored response (a chain's history is tested in ``test_dialects.py``)."""
    dialect = ResponsesDialect(get_profile("qwen3.5"), "m")
    return dialect.parse(_patched(RESPONSES, patch), cast(SessionState, None), None)


@pytest.mark.parametrize(("patch", "message", "param", "code"), RESPONSES_REFUSALS)
def test_responses_refusals_keep_their_words(
    patch: dict[str, object], message: str, param: str, code: str
) -> None:
    with pytest.raises(RequestError) as refused:
        _responses(patch)
    assert (str(refused.value), refused.value.param, refused.value.code) == (message, param, code)


def test_responses_schema_merges_one_assistant_turn() -> None:
    """Reasoning, text and calls of one turn become one assistant message; hosted tools dropped, namespaces flattened."""
    conv = _responses({})
    assert conv.messages == [
        {"role": "system", "content": "sys\n\ndev"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x", "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
        {"role": "tool", "tool_call_id": "c2", "content": "o2"},
        {"role": "assistant", "content": "y", "reasoning_content": "rthello"},
    ]  # fmt: skip
    assert [t["function"]["name"] for t in conv.tools or ()] == ["f", "g", "h"]
    assert conv.info["dropped_tools"] == ["web_search"] and conv.info["namespaces"] == {
        "g": "mcp__x",
        "h": "mcp__x",
    }
