"""The chat-completions request (``POST /v1/chat/completions``) as a typed pydantic schema.

Messages and tools are ``TypedDict``\\ s: pydantic-core checks them and hands back the plain dicts
the chat template renders, other keys (``name``, ``reasoning``, ``cache_control``) kept. Unknown
top-level fields are kept too (``model_extra``): chat records their names on the turn as ignored
(:mod:`dressage.proxy.dialects.chat`). :data:`RULES` words every nested error as the hand-written
checks did; top-level scalars get :mod:`.request_schema`'s shared wording.
"""

from __future__ import annotations

from typing import Annotated, Literal, Required

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from dressage.proxy.dialects.request_schema import INDEX, Rule, StrictRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_CHOICES = 16
NonEmpty = Annotated[str, Field(min_length=1)]
_OPEN = ConfigDict(extra="allow", strict=True)


@with_config(_OPEN)
class ChatMessage(TypedDict, total=False):
    """One message, as the template renders it (other keys pass through)."""

    role: Required[Literal["system", "developer", "user", "assistant", "tool"]]
    content: str | list[object] | None
    tool_calls: list[object] | None


@with_config(_OPEN)
class ChatFunction(TypedDict, total=False):
    """A tool's function: a name, an optional description, an object schema."""

    name: Required[NonEmpty]
    description: str | None
    parameters: dict[str, object] | None


@with_config(_OPEN)
class ChatTool(TypedDict, total=False):
    """One ``tools`` entry (``type`` defaults to ``function``)."""

    type: Literal["function"]
    function: Required[ChatFunction]


@with_config(_OPEN)
class NamedFunction(TypedDict):
    """``tool_choice.function``."""

    name: str


@with_config(_OPEN)
class NamedToolChoice(TypedDict):
    """``{"type": "function", "function": {"name": N}}``."""

    type: Literal["function"]
    function: NamedFunction


@with_config(_OPEN)
class TemplateKwargs(TypedDict, total=False):
    """``chat_template_kwargs``: the thinking switch is read, other keys pass."""

    enable_thinking: bool | None


class ChatRequest(StrictRequest):
    """The body, fields in the order they are checked (the first problem is the one reported)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    stream: bool | None = None
    stream_options: dict[str, object] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    min_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=1 << 20)
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=4)] | None = None
    response_format: dict[str, object] | None = None
    regex: NonEmpty | None = None
    ebnf: NonEmpty | None = None
    structured_outputs: dict[str, object] | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 24)
    max_tokens: int | None = Field(None, ge=1, le=1 << 24)
    chat_template_kwargs: TemplateKwargs | None = None


_TOOL = "tools[{0}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
RULES = (
    Rule(("messages", INDEX, "role"), "messages[{0}].role must be one of " + ", ".join(ROLES) + ", got {got!r}"),
    Rule(("messages", INDEX, "content"), "messages[{0}].content must be a string or an array of parts",
         "invalid_type"),
    Rule(("messages", INDEX, "tool_calls"), "messages[{0}].tool_calls must be an array", "invalid_type"),
    Rule(("messages", INDEX), "messages[{0}] must be an object", "invalid_type"),
    Rule(("messages",), "'messages' must be a non-empty array", "invalid_type"),
    Rule(("tools", INDEX, "function", "name"), "tools[{0}].function.name must be a non-empty string"),
    Rule(("tools", INDEX, "function", "description"), "tools[{0}].function.description must be a string",
         "invalid_type"),
    Rule(("tools", INDEX, "function", "parameters"),
         "tools[{0}].function parameters must be a JSON Schema object, got {got.__class__.__name__}",
         "invalid_type", "tools[{0}].function"),
    Rule(("tools", INDEX), _TOOL, param="tools[{0}]"),
    Rule(("tools",), "'tools' must be an array", "invalid_type"),
    Rule(("tool_choice",), "'tool_choice' must be 'auto', 'none', 'required' or "
         "{{'type': 'function', 'function': {{'name': ...}}}}, got {got!r}"),
    Rule(("stream_options",), "'stream_options' must be an object", "invalid_type"),
    Rule(("stop",), "'stop' must be a non-empty string or an array of up to 4"),
    Rule(("response_format",), "'response_format' must be an object with a 'type'", "invalid_type"),
    Rule(("regex",), "'regex' must be a non-empty string", "invalid_type"),
    Rule(("ebnf",), "'ebnf' must be a non-empty string", "invalid_type"),
    Rule(("structured_outputs",), "'structured_outputs' must be an object", "invalid_type"),
    Rule(("chat_template_kwargs", "enable_thinking"), "enable_thinking must be a boolean", "invalid_type"),
    Rule(("chat_template_kwargs",), "'chat_template_kwargs' must be an object", "invalid_type"),
)  # fmt: skip
"""Each nested field's error, worded as the hand-written checks worded it."""
