"""Parse Qwen3.5 model output into OpenAI fields: reasoning, content and tool calls.

Output shape (after a ``<think>\\n`` generation prompt)::

    reasoning...\\n</think>\\n\\ncontent<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n
    </function>\\n</tool_call>

Tool calls become ``{"id", "type": "function", "function": {"name", "arguments": JSON string}}``
with ids derived from a seed and the call's index (deterministic, so replays agree). A malformed
tool call never raises: its text stays in ``content`` and a :class:`ToolCallFailure` records why.
Parameter values follow the tool schema's declared type when known; otherwise a value is
JSON-decoded only when re-rendering it gives back the same text, so render(parse(x)) == x.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dressage.tito.chat_template import format_argument

# Reason codes for calls left as plain content.
FAIL_UNCLOSED = "unclosed_tool_call"  # <tool_call> without </tool_call> (often truncation)
FAIL_NO_FUNCTION = "missing_function"  # no <function=NAME>...</function> inside the block
FAIL_BAD_PARAMETERS = "malformed_parameters"  # text in the function body that is not <parameter=...> blocks
FAIL_DUPLICATE_PARAMETER = "duplicate_parameter"

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]+)>\n?(.*)</function>\s*\Z", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*(?=<parameter=|\Z)", re.DOTALL)
_PY_LITERALS = {"True": True, "False": False, "None": None}


@dataclass(frozen=True)
class ToolCallFailure:
    """A tool-call block that could not be parsed: reason code and the raw block text."""

    reason: str
    text: str


@dataclass
class ParsedAssistant:
    """An assistant turn split into OpenAI fields, plus parse failures (never raised)."""

    content: str
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    failures: list[ToolCallFailure] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI ``assistant`` message (``content`` None when empty and tools were called)."""
        msg: dict[str, object] = {
            "role": "assistant",
            "content": self.content or (None if self.tool_calls else ""),
        }
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def tool_call_id(seed: str, index: int) -> str:
    """Deterministic OpenAI-style id for the ``index``-th call of the turn identified by ``seed``."""
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]


def _schema_types(tools: Sequence[Mapping[str, object]] | None) -> dict[str, dict[str, object]]:
    """name -> {parameter -> declared JSON-schema type} for the given OpenAI tools."""
    out: dict[str, dict[str, object]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            out[fn["name"]] = {k: v.get("type") for k, v in props.items() if isinstance(v, Mapping)}
    return out


def convert_value(raw: str, declared: object = None, json_scalars: bool = False) -> object:
    """A parameter's text -> value: per declared type, else JSON only when it re-renders identically."""
    if declared == "string" or (isinstance(declared, list) and "string" in declared and len(declared) == 1):
        return raw
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        if declared not in (None, "string") and raw.strip() in _PY_LITERALS:
            return _PY_LITERALS[raw.strip()]
        return raw
    if declared is None and format_argument(value, json_scalars) != raw:
        return raw
    return value


def _parse_block(
    body: str, types: dict[str, dict[str, object]], json_scalars: bool = False
) -> tuple[str, dict[str, object]] | str:
    """(name, arguments) of one ``<tool_call>`` body, or a failure reason code."""
    m = _FUNCTION.match(body)
    if not m:
        return FAIL_NO_FUNCTION
    name, inner = m.group(1).strip(), m.group(2)
    declared = types.get(name, {})
    args: dict[str, object] = {}
    pos = 0
    for p in _PARAM.finditer(inner):
        if inner[pos : p.start()].strip():
            return FAIL_BAD_PARAMETERS
        key = p.group(1).strip()
        if key in args:
            return FAIL_DUPLICATE_PARAMETER
        args[key] = convert_value(p.group(2), declared.get(key), json_scalars)
        pos = p.end()
    if inner[pos:].strip():
        return FAIL_BAD_PARAMETERS
    return name, args


def split_think(text: str, think_open: bool) -> tuple[str | None, str]:
    """(reasoning, rest): ``think_open`` says the prompt already opened ``<think>``."""
    if "</think>" in text:
        head, _, rest = text.partition("</think>")
        head = head.split("<think>", 1)[1] if "<think>" in head else head
        return head.strip("\n"), rest.lstrip("\n")
    if think_open:
        return text.removeprefix("<think>").strip("\n"), ""
    return None, text


def parse_assistant_text(
    text: str,
    *,
    tools: Sequence[Mapping[str, object]] | None = None,
    think_open: bool = True,
    seed: str | None = None,
    json_scalars: bool = False,
) -> ParsedAssistant:
    """Split generated text into reasoning, content and tool calls (never raises); ``json_scalars``:
    the Qwen3.6 argument form (see :class:`~dressage.tito.chat_template.QwenFlavor`)."""
    reasoning, rest = split_think(text, think_open)
    types = _schema_types(tools)
    seed = seed if seed is not None else hashlib.sha256(text.encode()).hexdigest()[:16]
    content_parts: list[str] = []
    calls: list[dict[str, object]] = []
    failures: list[ToolCallFailure] = []
    pos = 0
    for m in _BLOCK.finditer(rest):
        content_parts.append(rest[pos : m.start()])
        parsed = _parse_block(m.group(1), types, json_scalars)
        if isinstance(parsed, str):
            failures.append(ToolCallFailure(parsed, m.group(0)))
            content_parts.append(m.group(0))
        else:
            name, args = parsed
            calls.append(
                {
                    "id": tool_call_id(seed, len(calls)),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
        pos = m.end()
    tail = rest[pos:]
    if "<tool_call>" in tail:
        failures.append(ToolCallFailure(FAIL_UNCLOSED, tail[tail.index("<tool_call>") :]))
    content_parts.append(tail)
    content = "".join(content_parts).strip() if calls else "".join(content_parts)
    return ParsedAssistant(content=content, reasoning_content=reasoning, tool_calls=calls, failures=failures)
