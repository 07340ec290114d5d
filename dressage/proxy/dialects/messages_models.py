"""The Anthropic Messages request (``POST /v1/messages``, ``/count_tokens``) as a typed pydantic schema.

Messages are a union on ``role``, their blocks unions on ``type``, and a content either a string or
blocks (``Tag("text")`` / ``Tag("blocks")``): pydantic-core checks the whole history and hands back
plain dicts, which :mod:`dressage.proxy.dialects.messages` turns into the chat template's messages.
Keys this proxy does not read (``cache_control``, ``citations``, ``signature``) are accepted, as before.
:data:`RULES` words every error as the hand-written checks did; unknown top-level fields are
refused before validation (:func:`~dressage.proxy.conversation.refuse_unknown`, naming them all).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, Required

from pydantic import ConfigDict, Discriminator, Field, Tag, with_config
from typing_extensions import TypedDict

from dressage.errors import RequestError
from dressage.proxy.conversation import unsupported
from dressage.proxy.dialects.request_schema import INDEX, PatternStep, Rule, StrictRequest, UnionTag

NonEmpty = Annotated[str, Field(min_length=1)]
_SHAPE = ConfigDict(extra="ignore", strict=True)
"""Keys this proxy does not read (``cache_control``, ``citations``, ``signature``) are accepted and left
out of the validated dicts: nothing reads them, and not copying them is a third of the validation."""


def _text_or_blocks(value: object) -> str:
    return "text" if isinstance(value, str) else "blocks"


@with_config(_SHAPE)
class TextPart(TypedDict, total=False):
    """A text block where only text may stand (``system``, a tool result); ``type`` defaults to text."""

    type: Literal["text"]
    text: Required[str]


Text = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("blocks")], Discriminator(_text_or_blocks)
]


@with_config(_SHAPE)
class TextBlock(TypedDict):
    """A ``text`` block of a user or assistant turn."""

    type: Literal["text"]
    text: str


@with_config(_SHAPE)
class ToolResultBlock(TypedDict, total=False):
    """A client's result of a ``tool_use`` (``is_error`` has no slot in the template: accepted)."""

    type: Required[Literal["tool_result"]]
    tool_use_id: Required[NonEmpty]
    content: Text | None
    is_error: bool | None


@with_config(_SHAPE)
class ThinkingBlock(TypedDict):
    """The model's reasoning, sent back (its ``signature`` is not checked)."""

    type: Literal["thinking"]
    thinking: str


@with_config(_SHAPE)
class ToolUseBlock(TypedDict):
    """The model's tool call, sent back."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, object]


UserBlock = Annotated[TextBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ThinkingBlock | ToolUseBlock, Field(discriminator="type")]


UserContent = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[UserBlock], Tag("blocks")], Discriminator(_text_or_blocks)
]
AssistantContent = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[AssistantBlock], Tag("blocks")],
    Discriminator(_text_or_blocks),
]


@with_config(_SHAPE)
class UserMessage(TypedDict):
    """A user turn: text and tool results."""

    role: Literal["user"]
    content: UserContent


@with_config(_SHAPE)
class AssistantMessage(TypedDict):
    """An assistant turn: reasoning, text, tool calls."""

    role: Literal["assistant"]
    content: AssistantContent


@with_config(_SHAPE)
class SystemMessage(TypedDict):
    """A system message inside ``messages`` (Claude Code sends one after the first user message)."""

    role: Literal["system"]
    content: Text


Message = Annotated[UserMessage | AssistantMessage | SystemMessage, Field(discriminator="role")]


@with_config(_SHAPE)
class CustomTool(TypedDict, total=False):
    """A custom tool (``defer_loading``, ``cache_control`` accepted without effect)."""

    type: Literal["custom"]
    input_schema: Required[dict[str, object]]
    name: Required[NonEmpty]
    description: str | None


@with_config(_SHAPE)
class ToolChoice(TypedDict, total=False):
    """``tool_choice``; ``name`` is checked against the tools when the choice is resolved."""

    type: Required[Literal["auto", "any", "tool", "none"]]
    name: object
    disable_parallel_tool_use: object


class MessagesRequest(StrictRequest):
    """A Messages body (and a ``count_tokens`` body, whose fields are a subset), in checking order."""

    messages: list[Message] = Field(min_length=1)
    system: Text | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: dict[str, object] | None = None
    context_management: dict[str, object] | None = None
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=1 << 24)
    temperature: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1, le=1 << 20)
    stop_sequences: list[NonEmpty] | None = None
    stream: bool | None = None
    thinking: dict[str, object] | None = None


# --- errors, worded as before -----------------------------------------------------------------------

_UNSUPPORTED_BLOCKS = {
    "user": {
        k: f"{k} blocks are not supported (text models only)" for k in ("image", "document", "search_result")
    },
    "assistant": {
        "redacted_thinking": "redacted_thinking blocks (another provider's encrypted reasoning) are not supported"
    },
}


def _kind(value: object) -> object:
    return value.get("type") if isinstance(value, dict) else None


def _block(role: str) -> Rule:
    """A block whose ``type`` is not one of the role's: unsupported (images...) or unknown."""

    def refuse(at: Sequence[int], got: object) -> RequestError:
        where, kind = f"messages[{at[0]}].content[{at[1]}]", _kind(got)
        if isinstance(kind, str) and kind in _UNSUPPORTED_BLOCKS[role]:
            return unsupported(where, _UNSUPPORTED_BLOCKS[role][kind])
        return RequestError(f"{where} has an unknown block type {kind!r}", param=where, code="invalid_value")

    pattern = ("messages", INDEX, UnionTag(role), "content", UnionTag("blocks"), INDEX)
    return Rule(pattern, refuse, types=frozenset({"union_tag_invalid", "union_tag_not_found", "model_type",
                                                  "model_attributes_type", "dict_type"}))  # fmt: skip


def _text_rules(prefix: tuple[PatternStep, ...], where: str) -> list[Rule]:
    """A text content's errors (``system``, a system message, a tool result), as ``_text_blocks`` worded them."""

    def refuse(at: Sequence[int], kind: object) -> RequestError:
        spot = f"{where}[{{{len(at) - 1}}}]".format(*at)
        return RequestError(f"{spot} must be a text block, got {kind!r}", param=spot, code="invalid_value")

    blocks = (*prefix, UnionTag("blocks"), INDEX)
    n = sum(1 for step in prefix if step is INDEX)
    return [
        Rule((*blocks, "type"), refuse),
        Rule(
            (*blocks, "text"),
            f"{where}[{{{n}}}] must be a text part with a string 'text'",
            param=f"{where}[{{{n}}}]",
        ),
        Rule(blocks, lambda at, got: refuse(at, type(got).__name__)),
        Rule(prefix, f"{where} must be a string or an array of text parts", "invalid_type"),
    ]


def _role(at: Sequence[int], got: object) -> RequestError:
    role = got.get("role") if isinstance(got, dict) else None
    return RequestError(
        f"messages[{at[0]}].role must be user, assistant or system, got {role!r}",
        param=f"messages[{at[0]}].role",
        code="invalid_value",
    )


def _server_tool(at: Sequence[int], got: object) -> RequestError:
    return unsupported(
        f"tools[{at[0]}]", f"server tool {got!r} (run by Anthropic's servers) is not supported"
    )


_USER_BLOCK = ("messages", INDEX, UnionTag("user"), "content", UnionTag("blocks"), INDEX)
_ASSISTANT_BLOCK = ("messages", INDEX, UnionTag("assistant"), "content", UnionTag("blocks"), INDEX)
_AT = "messages[{0}].content[{1}]"
RULES = (
    Rule((*_USER_BLOCK, UnionTag("text"), "text"), _AT + "[0] must be a text part with a string 'text'",
         param=_AT + "[0]"),
    Rule((*_USER_BLOCK, UnionTag("tool_result"), "tool_use_id"), _AT + ".tool_use_id must be a string"),
    *_text_rules((*_USER_BLOCK, UnionTag("tool_result"), "content"), _AT + ".content"),
    Rule((*_USER_BLOCK, UnionTag("tool_result"), "is_error"), _AT + ".is_error must be a boolean", "invalid_type"),
    _block("user"),
    Rule((*_ASSISTANT_BLOCK, UnionTag("text"), "text"), _AT + "[0] must be a text part with a string 'text'",
         param=_AT + "[0]"),
    Rule((*_ASSISTANT_BLOCK, UnionTag("thinking"), "thinking"), _AT + ".thinking must be a string", "invalid_type"),
    Rule((*_ASSISTANT_BLOCK, UnionTag("tool_use")), _AT + " must have a string id and name and an object input",
         param=_AT),
    _block("assistant"),
    Rule(("messages", INDEX, UnionTag("user"), "content"), "messages[{0}].content must be a string or an array of "
         "blocks", "invalid_type"),
    Rule(("messages", INDEX, UnionTag("assistant"), "content"), "messages[{0}].content must be a string or an "
         "array of blocks", "invalid_type"),
    *_text_rules(("messages", INDEX, UnionTag("system"), "content"), "messages[{0}].content"),
    Rule(("messages", INDEX), _role, types=frozenset({"union_tag_invalid", "union_tag_not_found"})),
    Rule(("messages", INDEX), "messages[{0}] must be an object", "invalid_type"),
    Rule(("messages",), "'messages' must be a non-empty array", "invalid_type"),
    *_text_rules(("system",), "system"),
    Rule(("tools", INDEX, "type"), _server_tool),
    Rule(("tools", INDEX, "input_schema"), "tools[{0}].input_schema must be a JSON Schema object", "invalid_type"),
    Rule(("tools", INDEX, "name"), "tools[{0}].name must be a non-empty string"),
    Rule(("tools", INDEX, "description"), "tools[{0}].description must be a string", "invalid_type"),
    Rule(("tools", INDEX), "tools[{0}] must be an object", "invalid_type"),
    Rule(("tools",), "'tools' must be an array", "invalid_type"),
    Rule(("tool_choice",), "tool_choice must be {{'type': 'auto' | 'any' | 'tool' | 'none'}}"),
    Rule(("context_management",), "'context_management' must be {{'edits': [objects]}}", "invalid_type"),
    Rule(("stop_sequences",), "'stop_sequences' must be an array of non-empty strings"),
    Rule(("thinking",), "thinking must be {{'type': 'enabled' | 'adaptive' | 'disabled'}}", param="thinking.type"),
)  # fmt: skip
"""Each nested field's error, worded as the hand-written checks worded it."""
