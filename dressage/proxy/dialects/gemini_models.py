"""The Gemini API's wire shapes (``generateContent``, ``countTokens``) as typed pydantic models.

Requests are validated strictly: every field is spelled as Gemini spells it (camelCase), an
unknown field is refused (``extra="forbid"``), and :func:`validate` turns the first validation
error into a :class:`~dressage.errors.RequestError` naming the field by its path
(``contents[0].parts[1].functionCall.args``). What the proxy does with the fields lives in
:mod:`dressage.proxy.dialects.gemini`; replies are built from the response models here and dumped
with their camelCase names, ``None`` fields left out.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from dressage.errors import RequestError

M = TypeVar("M", bound=BaseModel)


class _Request(BaseModel):
    """A request shape: camelCase names (Google's JSON parser also takes the proto's snake_case, and
    the SDK sends some fields, e.g. ``thinkingConfig``'s, that way), strict types, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True, frozen=True
    )


class _Reply(BaseModel):
    """A reply shape: dumped by alias, ``None`` left out."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object Gemini clients read."""
        return self.model_dump(by_alias=True, exclude_none=True)


# --- requests ---------------------------------------------------------------------------------------


class FunctionCall(_Request):
    """A model's call of a declared function (``args`` an object)."""

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class FunctionResponse(_Request):
    """A client's result of a function call (``response`` an object)."""

    name: str = Field(min_length=1)
    response: dict[str, Any]
    id: str | None = None
    will_continue: bool | None = None
    scheduling: None = None


class Part(_Request):
    """One part of a content: text (a thought when ``thought``), a function call or a function response.

    Gemini's ``Part`` is a oneof; :func:`dressage.proxy.dialects.gemini.part_kind` refuses a part
    holding several (checked where the parts are walked anyway: a validator per part costs a Python
    call per part of a long history)."""

    text: str | None = None
    thought: bool | None = None
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class Content(_Request):
    """One turn: ``user`` or ``model`` and its parts."""

    role: Literal["user", "model"] | None = None
    parts: list[Part] = Field(min_length=1)


class FunctionDeclaration(_Request):
    """A function the model may call; ``parameters`` (OpenAPI schema) or ``parametersJsonSchema``."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None


class Tool(_Request):
    """One ``tools`` entry; only function declarations (Google's hosted tools are refused)."""

    function_declarations: list[FunctionDeclaration] | None = None


class FunctionCallingConfig(_Request):
    """``toolConfig.functionCallingConfig``."""

    mode: Literal["AUTO", "ANY", "NONE", "MODE_UNSPECIFIED"] | None = None
    allowed_function_names: list[str] | None = None


class ToolConfig(_Request):
    """``toolConfig``."""

    function_calling_config: FunctionCallingConfig | None = None


class ThinkingConfig(_Request):
    """``generationConfig.thinkingConfig``."""

    include_thoughts: bool | None = None
    thinking_budget: int | None = Field(default=None, ge=-1)
    thinking_level: Literal["MINIMAL", "LOW", "MEDIUM", "HIGH", "THINKING_LEVEL_UNSPECIFIED"] | None = None


class GenerationConfig(_Request):
    """``generationConfig``: sampling, length, stops, choices, structured output, thinking."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=1, le=1 << 20)
    max_output_tokens: int | None = Field(default=None, ge=1, le=1 << 24)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    candidate_count: int | None = Field(default=None, ge=1, le=16)
    seed: int | None = Field(default=None, ge=-(1 << 31), le=(1 << 31) - 1)
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = None
    thinking_config: ThinkingConfig | None = None


class GenerateContentRequest(_Request):
    """The body of ``models/{model}:generateContent`` and ``:streamGenerateContent``."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | None = None
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None
    model: str | None = None


class CountTokensRequest(_Request):
    """The body of ``models/{model}:countTokens``: ``contents``, or a whole ``generateContentRequest``."""

    contents: list[Content] | None = None
    generate_content_request: GenerateContentRequest | None = None


# --- replies ----------------------------------------------------------------------------------------


class ReplyFunctionCall(_Reply):
    """A parsed tool call: its id, name and decoded arguments."""

    id: str
    name: str
    args: dict[str, Any]


class ReplyPart(_Reply):
    """A reply part: thought text, text, or a function call; the signature rides on one part."""

    text: str | None = None
    thought: bool | None = None
    function_call: ReplyFunctionCall | None = None
    thought_signature: str | None = None


class ReplyContent(_Reply):
    """The model's content of one candidate."""

    role: Literal["model"] = "model"
    parts: list[ReplyPart]


class Candidate(_Reply):
    """One candidate (one choice of the request)."""

    content: ReplyContent
    finish_reason: str | None = None
    index: int = 0


class UsageMetadata(_Reply):
    """Token counts, equal to the log: prompt, visible candidates, thoughts, their total."""

    prompt_token_count: int
    candidates_token_count: int
    thoughts_token_count: int
    total_token_count: int


class GenerateContentResponse(_Reply):
    """A ``generateContent`` reply, or one chunk of ``streamGenerateContent``."""

    candidates: list[Candidate]
    usage_metadata: UsageMetadata | None = None
    model_version: str
    response_id: str


def _where(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as a path: ``contents[0].parts[1].text``."""
    out = ""
    for step in loc:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "the request body"


def validate(model: type[M], body: dict[str, object]) -> M:
    """``body`` as ``model``; the first problem becomes a :class:`RequestError` naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = _where(tuple(first["loc"]))
        if first["type"] == "extra_forbidden":
            message = f"unknown field {where} is not supported by this proxy"
            code = "unknown_parameter"
        else:
            message = f"{where}: {first['msg']}"
            code = "invalid_value"
        raise RequestError(message, param=where, code=code) from None
