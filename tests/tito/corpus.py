"""A varied corpus of OpenAI-shaped conversations for template equality tests."""

from __future__ import annotations

import json
from typing import Any

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": 'Weather for a city. Use "metric" units.',
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "units": {"enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
SHELL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command — prints stdout. Ünïcödé ok.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "env": {"type": "object"}},
        },
    },
}
TOOLS = [WEATHER, SHELL]


def call(name: str, args: Any, idx: int = 0) -> dict[str, Any]:
    """An OpenAI tool call; ``args`` may be a dict (kept) or a string (JSON)."""
    return {"id": f"call_{idx}", "type": "function", "function": {"name": name, "arguments": args}}


def _loop(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Go."},
    ]
    for i in range(n):
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": f"step {i}",
                "tool_calls": [call("bash", json.dumps({"cmd": f"ls {i}"}), i)],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"out {i}\n"})
    return msgs


U = {"role": "user", "content": "Hi"}
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ("single_user", [U], None),
    ("system_user", [{"role": "system", "content": "Be brief."}, U], None),
    ("developer_user", [{"role": "developer", "content": "Dev rules."}, U], None),
    ("empty_system", [{"role": "system", "content": ""}, U], None),
    ("empty_system_tools", [{"role": "system", "content": "  "}, U], TOOLS),
    ("system_tools", [{"role": "system", "content": "Sys.\n"}, U], TOOLS),
    ("tools_no_system", [U], [WEATHER]),
    ("user_ws", [{"role": "user", "content": "  padded \n\n"}], None),
    (
        "user_parts",
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": " b"}]}],
        None,
    ),
    ("system_parts", [{"role": "system", "content": [{"type": "text", "text": "S1"}]}, U], TOOLS),
    (
        "user_image",
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "x"}},
                    {"type": "text", "text": "what?"},
                ],
            }
        ],
        None,
    ),
    (
        "unicode",
        [{"role": "user", "content": 'héllo 你好 😀 \u200b \u2018quotes\u2019 "dq" <b>&amp;</b>'}],
        None,
    ),
    (
        "multi_turn",
        [U, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}],
        None,
    ),
    ("assistant_last", [U, {"role": "assistant", "content": "Hello!"}], None),
    (
        "assistant_none_content",
        [U, {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris"})]}],
        TOOLS,
    ),
    (
        "reasoning_last_turn",
        [U, {"role": "assistant", "content": "Answer", "reasoning_content": "Let me think.\n"}],
        None,
    ),
    ("reasoning_alias", [U, {"role": "assistant", "content": "Answer", "reasoning": "via alias"}], None),
    (
        "old_reasoning_stripped",
        [
            U,
            {"role": "assistant", "content": "A1", "reasoning_content": "old"},
            {"role": "user", "content": "Q2"},
        ],
        None,
    ),
    (
        "inline_think",
        [U, {"role": "assistant", "content": "<think>\ninline thought\n</think>\n\nvisible"}],
        None,
    ),
    (
        "inline_think_old",
        [U, {"role": "assistant", "content": "<think>x</think>y"}, {"role": "user", "content": "z"}],
        None,
    ),
    (
        "reasoning_and_inline",
        [U, {"role": "assistant", "content": "<think>a</think>b", "reasoning_content": "r"}],
        None,
    ),
    (
        "one_call_str",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("get_weather", '{"city": "Paris", "days": 3}')],
            },
        ],
        TOOLS,
    ),
    (
        "one_call_dict",
        [
            U,
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [call("get_weather", {"city": "Paris"})],
            },
        ],
        TOOLS,
    ),
    (
        "multi_calls",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("get_weather", {"city": "A"}, 0),
                    call("get_weather", '{"city": "B"}', 1),
                    call("bash", {"cmd": "pwd"}, 2),
                ],
            },
        ],
        TOOLS,
    ),
    (
        "nested_args",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "bash", {"cmd": 'echo "hi"\nls', "env": {"A": [1, 2.5, None, True], "B": {"c": "ü"}}}
                    )
                ],
            },
        ],
        TOOLS,
    ),
    (
        "scalar_args",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("bash", '{"n": 3, "f": 1.5, "b": false, "z": null, "s": "x y", "l": []}')
                ],
            },
        ],
        TOOLS,
    ),
    (
        "empty_args",
        [U, {"role": "assistant", "content": "", "tool_calls": [call("bash", "{}"), call("bash", "")]}],
        TOOLS,
    ),
    (
        "call_and_result",
        [
            U,
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_0", "content": "Sunny 20C"},
        ],
        TOOLS,
    ),
    (
        "two_results",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("get_weather", {"city": "A"}), call("get_weather", {"city": "B"}, 1)],
            },
            {"role": "tool", "content": "A: rain"},
            {"role": "tool", "content": "B: sun"},
        ],
        TOOLS,
    ),
    (
        "results_then_answer",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "need weather",
                "tool_calls": [call("get_weather", {"city": "A"})],
            },
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "It rains.", "reasoning_content": "done"},
        ],
        TOOLS,
    ),
    (
        "results_then_user",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "need weather",
                "tool_calls": [call("get_weather", {"city": "A"})],
            },
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "It rains.", "reasoning_content": "done"},
            {"role": "user", "content": "Thanks"},
        ],
        TOOLS,
    ),
    (
        "tool_result_parts",
        [
            U,
            {"role": "assistant", "content": "", "tool_calls": [call("bash", {"cmd": "x"})]},
            {
                "role": "tool",
                "content": [{"type": "text", "text": "part1 "}, {"type": "text", "text": "part2"}],
            },
        ],
        TOOLS,
    ),
    (
        "tool_result_empty",
        [
            U,
            {"role": "assistant", "content": "", "tool_calls": [call("bash", {"cmd": "x"})]},
            {"role": "tool", "content": ""},
        ],
        TOOLS,
    ),
    (
        "user_tool_response_text",
        [U, {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}],
        None,
    ),
    ("loop_5", _loop(5), TOOLS),
    (
        "loop_12_answer",
        [
            *_loop(12),
            {"role": "assistant", "content": "Done.", "reasoning_content": "fin"},
            {"role": "user", "content": "More?"},
        ],
        TOOLS,
    ),
    (
        "content_with_newlines",
        [
            {"role": "user", "content": "line1\n\nline2\n"},
            {"role": "assistant", "content": "\n\nans\n\n"},
            {"role": "user", "content": "ok"},
        ],
        None,
    ),
    (
        "call_content_ws_only",
        [U, {"role": "assistant", "content": "  \n", "tool_calls": [call("bash", {"cmd": "a"})]}],
        TOOLS,
    ),
    (
        "call_after_think_only",
        [
            U,
            {
                "role": "assistant",
                "content": "<think>plan</think>",
                "tool_calls": [call("bash", {"cmd": "a"})],
            },
        ],
        TOOLS,
    ),
    ("empty_user", [{"role": "user", "content": ""}], None),
    ("assistant_empty_final", [U, {"role": "assistant", "content": ""}], None),
    (
        "quotes_in_args",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("bash", json.dumps({"cmd": "printf '%s\\n' \"a b\" </parameter>"}))],
            },
        ],
        TOOLS,
    ),
    (
        "tool_call_flat",
        [
            U,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "bash", "arguments": {"cmd": "flat"}}],
            },
        ],
        TOOLS,
    ),
    ("empty_tools_list", [{"role": "system", "content": "S"}, U], []),
]
