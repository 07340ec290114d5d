"""The OpenAI Responses request (``POST /v1/responses``) as a typed pydantic schema.

``input`` is a string or items, a union on ``type`` (``message`` when absent); ``tools`` a union
on ``type`` (function, namespace, or a hosted tool, which the dialect drops and records). pydantic-core
checks the items and hands back plain dicts, which :mod:`dressage.proxy.dialects.responses` merges
into the chat template's messages. A function tool's own fields and a reasoning item's text are
checked where they are used (:func:`~dressage.proxy.conversation.function_tool`, ``_reasoning_text``),
as before. :data:`RULES` words every error as the hand-written checks did; unknown top-level fields
are refused before validation, naming them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, Required

from pydantic import ConfigDict, Discriminator, Field, Tag, with_config
from typing_extensions import TypedDict

from dressage.errors import RequestError
from dressage.proxy.conversation import unsupported
from dressage.proxy.dialects.request_schema import INDEX, PatternStep, Rule, StrictRequest, UnionTag

HOSTED = frozenset(
    {"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
     "computer_use_preview", "mcp", "local_shell"}
)  # fmt: skip
_SHAPE = ConfigDict(extra="ignore", strict=True)
"""Keys this proxy does not read (an item's ``id`` and ``status``, a part's ``annotations``) are accepted
and left out of the validated dicts."""
_OPEN = ConfigDict(extra="allow", strict=True)


def _text_or_parts(value: object) -> str:
    return "text" if isinstance(value, str) else "parts"


@with_config(_SHAPE)
class ContentPart(TypedDict):
    """A text part of a message or a tool output (``input_text``, ``output_text``, ``text``)."""

    type: Literal["input_text", "output_text", "text"]
    text: str


@with_config(_SHAPE)
class TextPart(TypedDict):
    """A part of ``instructions``: any part with a string ``text``."""

    text: str


Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[ContentPart], Tag("parts")], Discriminator(_text_or_parts)
]
Instructions = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("parts")], Discriminator(_text_or_parts)
]


@with_config(_SHAPE)
class MessageItem(TypedDict, total=False):
    """A message; consecutive assistant items join one assistant message. Content is checked first."""

    type: Literal["message"]
    content: Required[Content]
    role: Required[Literal["user", "assistant", "system", "developer"]]


@with_config(_SHAPE)
class FunctionCallItem(TypedDict):
    """An assistant's tool call, sent back (``arguments`` its JSON text)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


@with_config(_SHAPE)
class FunctionCallOutputItem(TypedDict):
    """A tool's result."""

    type: Literal["function_call_output"]
    call_id: str
    output: Content


@with_config(_OPEN)
class ReasoningItem(TypedDict):
    """Reasoning, sent back: its text (content, our encrypted form, or summary) is read where it is used."""

    type: Literal["reasoning"]


def _item_kind(value: object) -> object:
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else None


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


Input = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[Item], Tag("parts")], Discriminator(_text_or_parts)
]


@with_config(_SHAPE)
class FunctionTool(TypedDict, total=False):
    """A function tool; its ``name``, ``description`` and ``parameters`` are checked as every dialect's are."""

    type: Required[Literal["function"]]
    name: object
    description: object
    parameters: object


@with_config(_SHAPE)
class NamespaceFunction(TypedDict, total=False):
    """A function inside a namespace (``type`` defaults to function)."""

    type: Literal["function"]
    name: object
    description: object
    parameters: object


@with_config(_SHAPE)
class NamespaceTool(TypedDict, total=False):
    """A namespace of function tools (Codex's MCP servers): flattened, calls answered with the namespace."""

    type: Required[Literal["namespace"]]
    name: object
    tools: Required[list[NamespaceFunction]]


@with_config(_SHAPE)
class HostedTool(TypedDict):
    """A tool OpenAI's servers would run: dropped, and recorded as dropped."""

    type: str


def _tool_kind(value: object) -> object:
    kind = value.get("type") if isinstance(value, dict) else None
    return "hosted" if kind in HOSTED else kind if kind in ("function", "namespace") else None


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


@with_config(_SHAPE)
class NamedToolChoice(TypedDict, total=False):
    """``{"type": "function", "name": N}`` (the name is checked against the tools)."""

    type: Required[Literal["function"]]
    name: object


@with_config(_SHAPE)
class Reasoning(TypedDict, total=False):
    """``reasoning``: the effort switches thinking; ``summary`` is the reasoning itself."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None


class ResponsesRequest(StrictRequest):
    """A Responses body, in checking order."""

    text: object = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    input: Input
    instructions: Instructions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    reasoning: Reasoning | None = None
    store: bool | None = None
    truncation: Literal["disabled", "auto"] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    model: str | None = None
    stream: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=1 << 24)


# --- errors, worded as before -----------------------------------------------------------------------


def _content_rules(prefix: tuple[PatternStep, ...], where: str) -> list[Rule]:
    """A message's content or a tool output: non-text parts are unsupported, a part needs a string text."""
    n = sum(1 for step in prefix if step is INDEX)
    part = f"{where}[{{{n}}}]"

    def refuse(at: Sequence[int], kind: object) -> RequestError:
        spot = part.format(*at)
        return unsupported(spot, f"content part {kind!r} is not supported (text models only)")

    parts = (*prefix, UnionTag("parts"), INDEX)
    return [
        Rule((*parts, "type"), refuse),
        Rule((*parts, "text"), part + " must be a text part with a string 'text'", param=part),
        Rule(parts, lambda at, got: refuse(at, None)),
        Rule(prefix, f"{where} must be a string or an array of text parts", "invalid_type"),
    ]


def _item(at: Sequence[int], got: object) -> RequestError:
    where = f"input[{at[0]}]"
    if not isinstance(got, dict):
        return RequestError(f"{where} must be an object", param=where, code="invalid_type")
    return unsupported(where, f"input item type {got.get('type', 'message')!r} is not supported")


def _role(at: Sequence[int], role: object) -> RequestError:
    return RequestError(
        f"input[{at[0]}].role must be user, assistant, system or developer, got {role!r}",
        param=f"input[{at[0]}].role",
        code="invalid_value",
    )


def _tool(at: Sequence[int], got: object) -> RequestError:
    kind = got.get("type") if isinstance(got, dict) else None
    return unsupported(f"tools[{at[0]}]", f"tool type {kind!r} is not supported")


_INPUT = ("input", UnionTag("parts"), INDEX)
_NAMESPACE = ("tools", INDEX, UnionTag("namespace"), "tools")
RULES = (
    *_content_rules((*_INPUT, UnionTag("message"), "content"), "input[{0}].content"),
    Rule((*_INPUT, UnionTag("message"), "role"), _role),
    Rule((*_INPUT, UnionTag("function_call")), "input[{0}] must have string call_id, name and arguments",
         param="input[{0}]"),
    Rule((*_INPUT, UnionTag("function_call_output"), "call_id"), "input[{0}].call_id must be a string"),
    *_content_rules((*_INPUT, UnionTag("function_call_output"), "output"), "input[{0}].output"),
    Rule(_INPUT, _item, types=frozenset({"union_tag_not_found", "union_tag_invalid"})),
    Rule(("input",), "'input' must be a string or an array of items", "invalid_type"),
    Rule(("include",), "'include' must be an array of strings", "invalid_type"),
    Rule(("previous_response_id",), "'previous_response_id' must be a string", "invalid_type"),
    Rule(("instructions", UnionTag("parts"), INDEX), "instructions[{0}] must be a text part with a string 'text'"),
    Rule(("instructions",), "instructions must be a string or an array of text parts", "invalid_type"),
    Rule((*_NAMESPACE, INDEX), lambda at, got: unsupported(
        f"tools[{at[0]}].tools[{at[1]}]", "a namespace may hold only function tools here")),
    Rule(_NAMESPACE, "tools[{0}].tools must be an array", "invalid_type"),
    Rule(("tools", INDEX), _tool, types=frozenset({"union_tag_not_found", "union_tag_invalid"})),
    Rule(("tools",), "'tools' must be an array", "invalid_type"),
    Rule(("tool_choice",), "tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': ...}}"),
    Rule(("reasoning", "effort"), lambda at, got: RequestError(
        f"reasoning.effort {got!r} is not known", param="reasoning.effort", code="invalid_value")),
    Rule(("truncation",), "'truncation' must be 'disabled' or 'auto'"),
)  # fmt: skip
"""Each nested field's error, worded as the hand-written checks worded it."""
