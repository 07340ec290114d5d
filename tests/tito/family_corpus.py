"""A family-neutral corpus of OpenAI-shaped conversations for the independent-reference tests.

Every conversation is valid for every family: tool-call ids are 9 alphanumerics (Mistral's rule),
arguments are JSON strings (DeepSeek's template concatenates them), an assistant turn carries
either content or tool calls, and tool results name their call. What is covered: system prompts,
multi-turn chats, tools, tool results, parallel calls, unicode, long agent loops.
"""

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
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
SHELL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command — prints stdout. Ünïcödé ok.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
TOOLS = [WEATHER, SHELL]

Message = dict[str, Any]


def call(name: str, args: dict[str, Any], idx: int = 0) -> dict[str, Any]:
    """An OpenAI tool call with a 9-character id and JSON-string arguments."""
    return {
        "id": f"call{idx:05d}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def calls(*items: tuple[str, dict[str, Any]]) -> Message:
    """An assistant turn that only calls tools (with reasoning, as a thinking model writes it)."""
    return {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need a tool.",
        "tool_calls": [call(n, a, i) for i, (n, a) in enumerate(items)],
    }


def result(content: str, idx: int = 0) -> Message:
    """The tool result of call ``idx``."""
    return {"role": "tool", "tool_call_id": f"call{idx:05d}", "content": content}


def user(text: str) -> Message:
    """A user turn."""
    return {"role": "user", "content": text}


def answer(text: str, reasoning: str | None = "Thinking it over.") -> Message:
    """An assistant answer (``reasoning`` is kept where the family renders it).

    Thinking models always write some reasoning: an empty block would make the generated ids
    differ from a re-tokenization (``<think>\n`` + ``\n</think>`` merge into ``\n\n``), which
    TITO rightly keeps as generated, and the corpus compares against re-tokenization.
    """
    msg: Message = {"role": "assistant", "content": text}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def agent_loop(n: int, system: str = "You are an agent.") -> list[Message]:
    """A system prompt, one task, then ``n`` rounds of one shell call and its result."""
    msgs: list[Message] = [{"role": "system", "content": system}, user("Fix the failing test.")]
    for i in range(n):
        msgs.append(calls(("bash", {"cmd": f"grep -n 'x{i}' src/m{i}.py"})))
        msgs.append(result(f"src/m{i}.py:{i + 3}: x{i} = {i}\n"))
    return msgs


SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATIONS: list[tuple[str, list[Message], list[dict[str, Any]] | None]] = [
    ("single_user", [user("Hi")], None),
    ("system_user", [SYSTEM, user("Hi")], None),
    ("multi_turn", [SYSTEM, user("Hi"), answer("Hello!"), user("Again?")], None),
    ("multi_turn_reasoning", [user("2+2?"), answer("4.", "Add them."), user("And 3+3?")], None),
    (
        "unicode",
        [
            user('héllo 你好 😀 \u200b \u2018quotes\u2019 "dq" <b>&amp;</b> e\u0301'),
            answer("ça va ✓"),
            user("ok"),
        ],
        None,
    ),
    ("newlines", [user("line1\n\nline2\n"), answer("ans\n\nmore"), user(" padded ")], None),
    ("tools_first_request", [SYSTEM, user("Weather in Paris?")], TOOLS),
    (
        "one_call",
        [SYSTEM, user("Weather in Paris?"), calls(("get_weather", {"city": "Paris"})), result("Sunny, 20C")],
        TOOLS,
    ),
    (
        "call_then_answer_then_user",
        [
            user("Weather in Paris?"),
            calls(("get_weather", {"city": "Paris", "days": 2})),
            result("Sunny, 20C"),
            answer("It is sunny.", "The tool said sunny."),
            user("And in Zürich?"),
        ],
        TOOLS,
    ),
    (
        "parallel_calls",
        [
            SYSTEM,
            user("Compare Paris and Rome."),
            calls(
                ("get_weather", {"city": "Paris"}),
                ("get_weather", {"city": "Rome"}),
                ("bash", {"cmd": "date"}),
            ),
            result("Paris: rain", 0),
            result("Rome: sun", 1),
            result("Tue Dec 1", 2),
        ],
        TOOLS,
    ),
    (
        "json_in_results",
        [
            user("List files"),
            calls(("bash", {"cmd": "ls -la | head -n 3"})),
            result('{"files": ["a.py", "b.md"], "count": 2}'),
        ],
        TOOLS,
    ),
    (
        "nested_arguments",
        [user("Run it"), calls(("bash", {"cmd": 'echo "hi"\nls', "env": {"A": [1, 2.5, None, True]}}))],
        TOOLS,
    ),
    ("agent_loop_6", agent_loop(6), TOOLS),
    ("agent_loop_40", agent_loop(40), TOOLS),
    (
        "long_context",
        [
            SYSTEM,
            user("Summarise: " + "lorem ipsum dolor sit amet, " * 400),
            answer("Latin filler."),
            user("Why?"),
        ],
        None,
    ),
]
