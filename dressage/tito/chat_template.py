"""Native Python renderer of the official Qwen3.5 / Qwen3.6 chat templates.

Byte-identical to rendering ``qwen3_5_think.jinja`` / ``qwen3_5_nothink.jinja`` the way
``transformers.apply_chat_template`` does, for conversations normalised by
:func:`normalize_messages` (OpenAI shapes: ``developer`` -> ``system``, ``None`` fields dropped,
JSON-string tool-call arguments decoded, ``reasoning``/``thinking`` aliased to
``reasoning_content``). Why native: it is ~100x faster than jinja and yields the rendering per
message, which incremental tokenization uses. The templates' behaviour worth knowing: reasoning of
assistant turns before the last real user query is dropped; assistant turns after it always get a
``<think>...</think>`` block; consecutive tool results share one ``user`` turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dressage.errors import TemplateError

# sha256 of the official template texts this renderer reproduces (trl/chat_templates/*.jinja).
QWEN35_TEMPLATE_SHA256 = {
    "think": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "nothink": "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80",
}
QWEN36_TEMPLATE_SHA256 = "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259"


@dataclass(frozen=True)
class QwenFlavor:
    """What differs between the Qwen3.5 and Qwen3.6 templates (the rest is the same text).

    ``json_scalars``: Qwen3.6 writes non-string tool-call arguments with ``tojson`` (``true``,
    ``null``), Qwen3.5 with ``str()`` (``True``, ``None``). ``preserve_thinking``: Qwen3.6's
    ``preserve_thinking=true`` keeps every assistant turn's ``<think>`` block, not only those
    after the last user query.
    """

    json_scalars: bool = False
    preserve_thinking: bool = False


QWEN35 = QwenFlavor()
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_VISION_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_VISION_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
_TOOLS_INTRO = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
_TOOLS_RULES = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>"
)
_REASONING_ALIASES = ("reasoning_content", "thinking", "reasoning")


def tojson(value: object) -> str:
    """JSON the way HF's ``tojson`` filter writes it (no ASCII escaping, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def _plain(value: object) -> Any:
    """Turn pydantic models / mappings into plain dicts and lists, recursively."""
    if hasattr(value, "model_dump") and callable(value.model_dump):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _decode_arguments(args: object) -> object:
    """Decode OpenAI's JSON-string tool-call arguments into the mapping the template iterates."""
    if not isinstance(args, str):
        return args
    if not args.strip():
        return {}
    try:
        decoded = json.loads(args)
    except json.JSONDecodeError as e:
        raise TemplateError(f"tool-call arguments are not valid JSON ({e}): {args[:200]!r}") from e
    except RecursionError as e:
        raise TemplateError("tool-call arguments are nested too deeply to render") from e
    if not isinstance(decoded, dict):
        raise TemplateError(f"tool-call arguments must be a JSON object, got {type(decoded).__name__}")
    return decoded


def normalize_messages(messages: Sequence[object]) -> list[dict[str, object]]:
    """OpenAI chat messages -> the dicts the official template expects (see module docstring)."""
    out: list[dict[str, object]] = []
    for raw in messages:
        msg = _plain(raw)
        if not isinstance(msg, dict):
            raise TemplateError(f"a chat message must be an object, got {type(msg).__name__}")
        msg = {k: v for k, v in msg.items() if v is not None}
        if msg.get("role") == "developer":
            msg["role"] = "system"
        reasoning = next((msg[k] for k in _REASONING_ALIASES if msg.get(k) is not None), None)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for call in calls:
                if isinstance(call, dict):
                    call = dict(call)
                    fn = call.get("function")
                    if isinstance(fn, dict) and "arguments" in fn:
                        call["function"] = {**fn, "arguments": _decode_arguments(fn["arguments"])}
                    elif "arguments" in call:
                        call["arguments"] = _decode_arguments(call["arguments"])
                fixed.append(call)
            msg["tool_calls"] = fixed
        out.append(msg)
    return out


def _text(value: object) -> str:
    """What jinja's ``{{ value }}`` writes for a scalar."""
    return value if isinstance(value, str) else str(value)


def render_content(content: object, *, is_system: bool = False) -> str:
    """The template's ``render_content`` macro (no vision ids): text, or text parts joined."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, Mapping) or not isinstance(content, list | tuple):
        raise TemplateError("Unexpected content type.")
    parts: list[str] = []
    for item in content:
        if not isinstance(item, Mapping):
            raise TemplateError("content parts must be objects with a 'type'")
        kind = item.get("type")
        if "image" in item or "image_url" in item or kind == "image":
            if is_system:
                raise TemplateError("System message cannot contain images.")
            parts.append(_VISION_IMAGE)
        elif "video" in item or kind == "video":
            if is_system:
                raise TemplateError("System message cannot contain videos.")
            parts.append(_VISION_VIDEO)
        elif "text" in item:
            parts.append(_text(item["text"]))
        else:
            raise TemplateError("Unexpected item type in content.")
    return "".join(parts)


def format_argument(value: object, json_scalars: bool = False) -> str:
    """A parameter value: JSON for objects/arrays, ``str()`` otherwise (Qwen3.5); Qwen3.6
    (``json_scalars``) writes every non-string value as JSON."""
    if isinstance(value, Mapping | list | tuple) or (json_scalars and not isinstance(value, str)):
        return tojson(value)
    return _text(value)


def render_tool_calls(tool_calls: Sequence[object], content: str, json_scalars: bool = False) -> str:
    """The XML the template writes for an assistant's tool calls, after its ``content``."""
    out: list[str] = []
    for j, call in enumerate(tool_calls):
        if isinstance(call, Mapping) and "function" in call:
            call = call["function"]
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise TemplateError("a tool call needs a function name (string)")
        if j == 0:
            out.append("\n\n<tool_call>\n<function=" if content.strip() else "<tool_call>\n<function=")
        else:
            out.append("\n<tool_call>\n<function=")
        out.append(call["name"] + ">\n")
        if "arguments" in call:
            args = call["arguments"]
            if not isinstance(args, Mapping):
                raise TemplateError("tool-call arguments must be an object (or a JSON string of one)")
            for name, value in args.items():
                out.append(f"<parameter={name}>\n{format_argument(value, json_scalars)}\n</parameter>\n")
        out.append("</function>\n</tool_call>")
    return "".join(out)


def split_reasoning(message: Mapping[str, Any], content: str) -> tuple[str, str]:
    """(reasoning, content) of an assistant message as the template computes them."""
    reasoning = ""
    if isinstance(message.get("reasoning_content"), str):
        reasoning = message["reasoning_content"]
    elif "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    return reasoning.strip(), content


def last_query_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last user message that is not only a ``<tool_response>`` wrapper."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            text = render_content(messages[i].get("content")).strip()
            if not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
                return i
    raise TemplateError("No user query found in messages.")


def generation_prompt(thinking: bool) -> str:
    """The text the template appends with ``add_generation_prompt``."""
    return f"{IM_START}assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n")


@dataclass(frozen=True)
class RenderedConversation:
    """A rendering split into parts: ``header + "".join(messages) + suffix == text``."""

    header: str
    messages: tuple[str, ...]
    suffix: str
    last_query_index: int

    @property
    def text(self) -> str:
        """The full rendered text."""
        return self.header + "".join(self.messages) + self.suffix


def render_header(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> str:
    """The system turn: the tools block (if any tools) and the first message when it is a system one."""
    first_is_system = messages[0].get("role") == "system"
    system = render_content(messages[0].get("content"), is_system=True).strip() if first_is_system else ""
    if tools and not isinstance(tools, Mapping | str):
        head = (
            f"{IM_START}system\n{_TOOLS_INTRO}"
            + "".join("\n" + tojson(t) for t in tools)
            + "\n</tools>"
            + _TOOLS_RULES
        )
        return head + (f"\n\n{system}" if system else "") + f"{IM_END}\n"
    return f"{IM_START}system\n{system}{IM_END}\n" if first_is_system else ""


def render_message(
    messages: Sequence[Mapping[str, Any]], i: int, last_query: int, flavor: QwenFlavor = QWEN35
) -> str:
    """The text message ``i`` contributes (its neighbours matter for tool results)."""
    msg = messages[i]
    role = msg.get("role")
    content = render_content(msg.get("content")).strip()
    if role == "system":
        if i != 0:
            raise TemplateError("System message must be at the beginning.")
        return ""
    if role == "user":
        return f"{IM_START}user\n{content}{IM_END}\n"
    if role == "assistant":
        reasoning, content = split_reasoning(msg, content)
        if flavor.preserve_thinking or i > last_query:
            out = f"{IM_START}assistant\n<think>\n{reasoning}\n</think>\n\n{content}"
        else:
            out = f"{IM_START}assistant\n{content}"
        calls = msg.get("tool_calls")
        if calls and isinstance(calls, list | tuple):
            out += render_tool_calls(calls, content, flavor.json_scalars)
        return out + f"{IM_END}\n"
    if role == "tool":
        out = f"{IM_START}user" if i > 0 and messages[i - 1] and messages[i - 1].get("role") != "tool" else ""
        out += f"\n<tool_response>\n{content}\n</tool_response>"
        if i == len(messages) - 1 or messages[i + 1].get("role") != "tool":
            out += f"{IM_END}\n"
        return out
    raise TemplateError("Unexpected message role.")


def render_qwen35_parts(
    messages: Sequence[Any],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    default_thinking: bool = True,
    normalized: bool = False,
    flavor: QwenFlavor = QWEN35,
) -> RenderedConversation:
    """Render a conversation into parts; ``default_thinking`` is True for the think template."""
    msgs = list(messages) if normalized else normalize_messages(messages)
    if not msgs:
        raise TemplateError("No messages provided.")
    header = render_header(msgs, _plain(tools) if tools is not None else None)
    last = last_query_index(msgs)
    parts = tuple(render_message(msgs, i, last, flavor) for i in range(len(msgs)))
    thinking = default_thinking if enable_thinking is None else enable_thinking
    suffix = generation_prompt(thinking) if add_generation_prompt else ""
    return RenderedConversation(header, parts, suffix, last)


def render_qwen35(
    messages: Sequence[object],
    tools: Sequence[object] | None = None,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    default_thinking: bool = True,
) -> str:
    """Render a conversation to the exact text of the official Qwen3.5 template."""
    return render_qwen35_parts(
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        default_thinking=default_thinking,
    ).text
