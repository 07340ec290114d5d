"""The Gemini API dialect: ``models/{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``.

Served under ``/v1beta`` (what the ``google-genai`` SDK and the Gemini CLI call) and ``/v1``, at
``/s/<token>/v1beta/...`` (a client sets its base URL to ``http://host:port/s/<token>``) or at
``/v1beta/...`` with the session token as the API key: the ``x-goog-api-key`` header or the
``?key=`` query parameter (then ``Authorization: Bearer``). The key is the session token: it is
only hashed, never logged (the proxy writes no access log).

Request -> shared conversation (the shapes: :mod:`.gemini_models`, validated strictly):

- ``systemInstruction`` (text parts) is the leading system prompt.
- ``contents``: ``user`` text parts are the user message, ``functionResponse`` parts tool messages
  in their order (a ``response`` of exactly ``{"output": str}`` or ``{"result": str}`` is that
  text, any other object its compact JSON); ``model`` parts: ``thought`` text parts the reasoning,
  text parts the content, ``functionCall`` parts the tool calls (``args`` rendered as any dialect's
  arguments). Reasoning also comes back in ``thoughtSignature``: every reply with reasoning carries
  one (its reasoning, encoded; on the first ``functionCall`` part, else on the text), so a client
  that drops thought parts from its history (as the Gemini CLI does) still sends back the exact
  reasoning; a signature wins over thought parts. A signature this proxy did not issue is refused,
  except the Gemini CLI's ``skip_thought_signature_validator``.
- ``tools[].functionDeclarations`` (``parameters`` as Gemini's OpenAPI schema, converted to JSON
  Schema: types lower-cased, ``nullable`` a ``null`` type, ``propertyOrdering`` the key order; or
  ``parametersJsonSchema`` as is); hosted tools (``googleSearch``, ``codeExecution``...) are refused.
- ``toolConfig.functionCallingConfig``: ``AUTO``, ``NONE``, ``ANY`` (forces a call; with
  ``allowedFunctionNames`` of one name that function, of every declared name any; another subset
  is refused: the model would be free to call the others).
- ``generationConfig``: ``temperature``, ``topP``, ``topK``, ``maxOutputTokens``, ``stopSequences``,
  ``candidateCount`` (several choices, each its own turn), ``seed``, ``responseMimeType``
  ``application/json`` with ``responseSchema`` / ``responseJsonSchema`` (constrained decoding, as
  chat's ``response_format``; without a schema a JSON object), ``thinkingConfig``:
  ``thinkingBudget`` 0 turns the template's thinking off, any other value on (the budget is not
  enforced: recorded as ignored), ``thinkingLevel`` on (recorded as ignored), ``includeThoughts``
  returns the reasoning as ``thought`` parts. Every other field is refused with a 400 naming it.

Replies: ``candidates[].content.parts`` (thought parts when asked, text, ``functionCall`` with an
``id``), ``finishReason`` ``STOP`` (also after function calls and stop sequences) or ``MAX_TOKENS``,
``usageMetadata`` from the log (``promptTokenCount``; ``thoughtsTokenCount``: the tokens up to
``</think>``; ``candidatesTokenCount``: the rest of the generated tokens; their total). Streams are
``data: {GenerateContentResponse}`` events (``?alt=sse``); errors are Google's
``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    fingerprint,
    function_tool,
    merge_defaults,
    parse_json_object,
    resolve_tool_choice,
    thinking_token_count,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer, url_or_bearer_token
from dressage.proxy.dialects.gemini_models import (
    Candidate,
    Content,
    CountTokensRequest,
    GenerateContentRequest,
    GenerateContentResponse,
    GenerationConfig,
    Part,
    ReplyContent,
    ReplyFunctionCall,
    ReplyPart,
    UsageMetadata,
    validate,
)
from dressage.proxy.errors import classify, error_message
from dressage.proxy.replies import reply_parse, think_open
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import SessionState
from dressage.proxy.streaming import sse
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant

SIGNATURE_PREFIX = b"dressage-reasoning:"
"""What every ``thoughtSignature`` this proxy issues starts with (then the reasoning, UTF-8)."""
SKIP_SIGNATURE = "skip_thought_signature_validator"
"""The signature the Gemini CLI writes on calls it made up itself: no reasoning."""

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
}
_SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object", "null"})
_SCHEMA_KEYS = frozenset(
    {"type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties",
     "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example",
     "anyOf", "propertyOrdering", "default", "items", "minimum", "maximum"}
)  # fmt: skip


@dataclass
class GeminiConversation(Conversation):
    """A Gemini request: the shared conversation and whether thought parts are returned."""

    include_thoughts: bool = False


# --- thought signatures -----------------------------------------------------------------------------


def thought_signature(reasoning: str) -> str:
    """The ``thoughtSignature`` carrying ``reasoning`` (url-safe base64, as the SDK encodes bytes)."""
    return base64.urlsafe_b64encode(SIGNATURE_PREFIX + reasoning.encode()).decode("ascii")


def signed_reasoning(signature: str, where: str) -> str | None:
    """The reasoning a signature carries (None for the Gemini CLI's skip value); 400 if not ours."""
    if signature == SKIP_SIGNATURE:
        return None
    try:
        raw = base64.urlsafe_b64decode(signature.replace("+", "-").replace("/", "_") + "==")
        if raw.startswith(SIGNATURE_PREFIX):
            return raw[len(SIGNATURE_PREFIX) :].decode()
    except (binascii.Error, ValueError):
        pass
    raise RequestError(
        f"{where} is not a thoughtSignature this proxy issued (send back the parts it returned)",
        param=where,
        code="invalid_value",
    )


# --- requests ---------------------------------------------------------------------------------------


def openapi_to_json_schema(schema: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Gemini's OpenAPI ``Schema`` as JSON Schema: the shape chat templates and grammars take."""
    unknown = sorted(k for k in schema if k not in _SCHEMA_KEYS)
    if unknown:
        raise unsupported(f"{where}.{unknown[0]}", f"schema field {where}.{unknown[0]} is not supported")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        at = f"{where}.{key}"
        if key in ("nullable", "propertyOrdering"):
            continue
        if key == "type":
            if not isinstance(value, str) or value.lower() not in _SCHEMA_TYPES:
                raise RequestError(
                    f"{at} must be one of {', '.join(sorted(_SCHEMA_TYPES)).upper()}", param=at
                )
            out["type"] = value.lower()
        elif key == "properties":
            props = _obj(value, at)
            out["properties"] = {
                n: openapi_to_json_schema(_obj(props[n], f"{at}.{n}"), f"{at}.{n}")
                for n in _ordered(props, schema.get("propertyOrdering"), f"{where}.propertyOrdering")
            }
        elif key == "items":
            out["items"] = openapi_to_json_schema(_obj(value, at), at)
        elif key == "anyOf":
            if not isinstance(value, list):
                raise RequestError(f"{at} must be an array of schemas", param=at, code="invalid_type")
            out["anyOf"] = [
                openapi_to_json_schema(_obj(s, f"{at}[{i}]"), f"{at}[{i}]") for i, s in enumerate(value)
            ]
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _ordered(props: Mapping[str, Any], order: object, where: str) -> list[str]:
    """Property names in ``propertyOrdering``'s order, then the rest in the order given."""
    if order is None:
        return list(props)
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        raise RequestError(f"{where} must be an array of property names", param=where, code="invalid_type")
    return [n for n in order if n in props] + [n for n in props if n not in order]


def _obj(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a schema object", param=where, code="invalid_type")
    return value


def _text(content: Content, where: str) -> str:
    """A content that may only hold text parts (``systemInstruction``) as one string."""
    out = []
    for j, part in enumerate(content.parts):
        part_kind(part, f"{where}.parts[{j}]")
        if part.text is None or part.thought:
            raise RequestError(f"{where}.parts[{j}] must be a text part", param=f"{where}.parts[{j}]")
        out.append(part.text)
    return "".join(out)


def part_kind(part: Part, at: str) -> str | None:
    """``text``, ``functionCall`` or ``functionResponse``: what a part holds (None: only a signature)."""
    kinds = [
        name
        for name, value in (("text", part.text), ("functionCall", part.function_call),
                            ("functionResponse", part.function_response))
        if value is not None
    ]  # fmt: skip
    if len(kinds) > 1:
        raise RequestError(
            f"{at} holds {' and '.join(kinds)}; a part holds one of text, functionCall, functionResponse",
            param=at,
        )
    if part.thought and part.text is None:
        raise RequestError(f"{at} is a thought part without text", param=f"{at}.text")
    return kinds[0] if kinds else None


def _tool_result(response: dict[str, Any]) -> str:
    """A ``functionResponse.response`` as the tool message's text (see the module docstring)."""
    if len(response) == 1:
        ((key, value),) = response.items()
        if key in ("output", "result") and isinstance(value, str):
            return value
    return json.dumps(response, ensure_ascii=False, separators=(",", ":"))


def _user(content: Content, where: str) -> list[dict[str, Any]]:
    """A user turn's parts as user messages (text) and tool messages (``functionResponse``), in order."""
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content.parts):
        at = f"{where}.parts[{j}]"
        kind = part_kind(part, at)
        if part.thought or part.thought_signature or kind == "functionCall":
            raise RequestError(
                f"{at}: thought, thoughtSignature and functionCall parts belong to role 'model'", param=at
            )
        if part.function_response is not None:
            fr = part.function_response
            text = _tool_result(fr.response)
            out.append({"role": "tool", "tool_call_id": fr.id or fr.name, "content": text})
        elif part.text is not None:
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += part.text
            else:
                out.append({"role": "user", "content": part.text})
        else:
            raise RequestError(f"{at} has no text or functionResponse", param=at, code="invalid_value")
    return out


def _model(content: Content, where: str) -> dict[str, Any]:
    """A model turn's parts as one assistant message: reasoning, content, tool calls."""
    thoughts: list[str] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    signed: str | None = None
    for j, part in enumerate(content.parts):
        at = f"{where}.parts[{j}]"
        kind = part_kind(part, at)
        if part.thought_signature is not None:
            got = signed_reasoning(part.thought_signature, f"{at}.thoughtSignature")
            signed = got if got is not None else signed
        if part.function_response is not None:
            raise RequestError(f"{at}: functionResponse parts belong to role 'user'", param=at)
        if part.function_call is not None:
            fc = part.function_call
            call = {
                "id": fc.id or fc.name,
                "type": "function",
                "function": {"name": fc.name, "arguments": fc.args},
            }
            calls.append(call)
        elif part.text is not None:
            (thoughts if part.thought else text).append(part.text)
        elif kind is None and part.thought_signature is None:
            raise RequestError(f"{at} has no text or functionCall", param=at, code="invalid_value")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    reasoning = signed if signed is not None else ("".join(thoughts) if thoughts else None)
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(req: GenerateContentRequest | CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation: the system instruction, then every content in order."""
    contents = req.contents or []
    out: list[dict[str, Any]] = []
    system = getattr(req, "system_instruction", None)
    if system is not None:
        out.append({"role": "system", "content": _text(system, "systemInstruction")})
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        if content.role == "model":
            out.append(_model(content, where))
        else:
            out.extend(_user(content, where))
    return out


def _tools(req: GenerateContentRequest) -> list[dict[str, Any]] | None:
    out = []
    for i, tool in enumerate(req.tools or ()):
        if tool.function_declarations is None:
            raise RequestError(f"tools[{i}] has no functionDeclarations", param=f"tools[{i}]")
        for j, fd in enumerate(tool.function_declarations):
            at = f"tools[{i}].functionDeclarations[{j}]"
            if fd.parameters is not None and fd.parameters_json_schema is not None:
                raise RequestError(
                    f"{at} may set parameters or parametersJsonSchema, not both",
                    param=f"{at}.parametersJsonSchema",
                )
            params = fd.parameters_json_schema
            if fd.parameters is not None:
                params = openapi_to_json_schema(fd.parameters, f"{at}.parameters")
            out.append(function_tool(fd.name, fd.description, params, at))
    return out or None


def _tool_choice(req: GenerateContentRequest, tools: list[dict[str, Any]] | None) -> tuple[bool, str | None]:
    config = req.tool_config.function_calling_config if req.tool_config else None
    mode = (config.mode if config else None) or "AUTO"
    allowed = config.allowed_function_names if config else None
    where = "toolConfig.functionCallingConfig"
    if allowed is not None and mode != "ANY":
        raise RequestError(
            f"{where}.allowedFunctionNames needs mode ANY", param=f"{where}.allowedFunctionNames"
        )
    if mode in ("AUTO", "MODE_UNSPECIFIED"):
        return resolve_tool_choice("auto", None, tools, f"{where}.mode")
    if mode == "NONE":
        return resolve_tool_choice("none", None, tools, f"{where}.mode")
    names = [t["function"]["name"] for t in tools or ()]
    if allowed and len(set(allowed)) == 1:
        return resolve_tool_choice("named", allowed[0], tools, f"{where}.allowedFunctionNames")
    if allowed and set(allowed) != set(names):
        raise unsupported(
            f"{where}.allowedFunctionNames",
            "allowedFunctionNames naming several but not all declared functions is not supported "
            "(one name, or every declared name)",
        )
    return resolve_tool_choice("required", None, tools, f"{where}.mode")


def _constraint(config: GenerationConfig, force_tool: str | None) -> dict[str, str]:
    """``responseMimeType`` / ``responseSchema`` / ``responseJsonSchema`` as SGLang's ``json_schema``."""
    mime = config.response_mime_type
    schemas = [s for s in (config.response_schema, config.response_json_schema) if s is not None]
    if len(schemas) > 1:
        raise RequestError(
            "generationConfig may set responseSchema or responseJsonSchema, not both",
            param="generationConfig.responseJsonSchema",
        )
    if mime in (None, "text/plain"):
        if schemas:
            raise RequestError(
                "a response schema needs generationConfig.responseMimeType 'application/json'",
                param="generationConfig.responseMimeType",
            )
        return {}
    if mime != "application/json":
        raise unsupported("generationConfig.responseMimeType", f"responseMimeType {mime!r} is not supported")
    if force_tool is not None:
        raise RequestError(
            "functionCallingConfig mode ANY cannot be combined with a JSON response: both constrain the output",
            param="generationConfig.responseMimeType",
        )
    if config.response_schema is not None:
        schema = openapi_to_json_schema(config.response_schema, "generationConfig.responseSchema")
    else:
        schema = config.response_json_schema or {"type": "object"}
    return {"json_schema": json.dumps(schema, ensure_ascii=False)}


def _thinking(config: GenerationConfig, ignored: list[str]) -> tuple[bool | None, bool]:
    """(the template's thinking switch, whether thought parts are returned)."""
    tc = config.thinking_config
    if tc is None:
        return None, False
    enable: bool | None = None
    if tc.thinking_budget is not None:
        enable = tc.thinking_budget != 0
        if tc.thinking_budget > 0:
            ignored.append("generationConfig.thinkingConfig.thinkingBudget")
    if tc.thinking_level is not None:
        if enable is False:
            raise RequestError(
                "thinkingLevel cannot be combined with thinkingBudget 0",
                param="generationConfig.thinkingConfig.thinkingLevel",
            )
        enable = True
        ignored.append("generationConfig.thinkingConfig.thinkingLevel")
    return enable, bool(tc.include_thoughts)


def _sampling(config: GenerationConfig) -> dict[str, object]:
    sampling: dict[str, object] = {}
    for key, value in (("temperature", config.temperature), ("top_p", config.top_p), ("top_k", config.top_k)):
        if value is not None:
            sampling[key] = value
    if config.seed is not None:
        sampling["sampling_seed"] = config.seed
    for i, stop in enumerate(config.stop_sequences or ()):
        if not stop:
            at = f"generationConfig.stopSequences[{i}]"
            raise RequestError(f"{at} must not be empty", param=at)
    if config.stop_sequences:
        sampling["stop"] = list(config.stop_sequences)
    return sampling


def parse_gemini_request(
    raw: bytes, stream: bool, default_sampling: Mapping[str, object] | None = None
) -> GeminiConversation:
    """Validate a raw ``generateContent`` body into the shared conversation (:class:`RequestError` if wrong)."""
    req = validate(GenerateContentRequest, parse_json_object(raw))
    tools = _tools(req)
    parse_tools, force_tool = _tool_choice(req, tools)
    config = req.generation_config or GenerationConfig()
    ignored: list[str] = []
    enable_thinking, include_thoughts = _thinking(config, ignored)
    sampling = _sampling(config)
    sampling.update(_constraint(config, force_tool))
    return GeminiConversation(
        dialect="gemini",
        messages=_messages(req),
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=stream,
        enable_thinking=enable_thinking,
        model=req.model,
        max_tokens=merge_defaults(sampling, config.max_output_tokens, default_sampling),
        sampling=sampling,
        fingerprint=fingerprint("gemini-stream" if stream else "gemini", raw),
        include_usage=True,
        ignored=ignored,
        n=config.candidate_count or 1,
        include_thoughts=include_thoughts,
    )


def parse_count_tokens_request(raw: bytes) -> GeminiConversation:
    """A ``countTokens`` body (``contents`` or ``generateContentRequest``) as the conversation it would send."""
    req = validate(CountTokensRequest, parse_json_object(raw))
    if (req.contents is None) == (req.generate_content_request is None):
        raise RequestError(
            "countTokens needs exactly one of contents and generateContentRequest", param="contents"
        )
    if req.generate_content_request is not None:
        body = req.generate_content_request.model_dump(by_alias=True, exclude_none=True)
        return parse_gemini_request(json.dumps(body).encode(), stream=False)
    return GeminiConversation(
        dialect="gemini",
        messages=_messages(req),
        tools=None,
        parse_tools=False,
        force_tool=None,
        stream=False,
        enable_thinking=None,
        model=None,
        max_tokens=None,
        sampling={},
        fingerprint=fingerprint("gemini-count", raw),
    )


# --- replies ----------------------------------------------------------------------------------------


def finish_reason(reply: ReplyData) -> str:
    """``MAX_TOKENS`` when the length cap ended the turn, else ``STOP`` (calls and stop sequences too)."""
    return "MAX_TOKENS" if reply.stop_reason == "length" else "STOP"


def reply_parts(parsed: ParsedAssistant, include_thoughts: bool, text: bool = True) -> list[ReplyPart]:
    """A parse as parts: thought (when asked), text, function calls; the reasoning's signature on the
    first function call, else on the text, else on an empty text part (clients merge text parts, and
    keep a call's signature)."""
    parts: list[ReplyPart] = []
    reasoning = parsed.reasoning_content
    if include_thoughts and reasoning:
        parts.append(ReplyPart(text=reasoning, thought=True))
    if text and parsed.content:
        parts.append(ReplyPart(text=parsed.content))
    for call in parsed.tool_calls:
        fn = call["function"]
        args = json.loads(fn["arguments"] or "{}")
        parts.append(ReplyPart(function_call=ReplyFunctionCall(id=call["id"], name=fn["name"], args=args)))
    if reasoning is not None:  # where Gemini puts it: the first call, else the last (text) part
        calls = [p for p in parts if p.function_call is not None]
        signed = calls[0] if calls else (parts[-1] if parts and not parts[-1].thought else None)
        if signed is None:
            parts.append(signed := ReplyPart(text=""))
        signed.thought_signature = thought_signature(reasoning)
    return parts


def usage_metadata(profile: ModelProfile, conv: Conversation, replies: list[ReplyData]) -> UsageMetadata:
    """Usage from the log: the shared prompt, thoughts (through ``</think>``, or every generated token
    when the output ended inside an opened thinking block) and the other generated tokens."""
    end = profile.tokenizer.encode("</think>")
    end_id = end[0] if len(end) == 1 else None
    opened = think_open(profile, conv)
    generated = sum(len(r.generated_ids) for r in replies)
    thoughts = sum(thinking_token_count(r.generated_ids, end_id, opened) for r in replies)
    prompt = replies[0].prompt_tokens
    return UsageMetadata(
        prompt_token_count=prompt,
        candidates_token_count=generated - thoughts,
        thoughts_token_count=thoughts,
        total_token_count=prompt + generated,
    )


def response_body(
    profile: ModelProfile, conv: GeminiConversation, reply: ReplyData, model: str
) -> GenerateContentResponse:
    """The ``GenerateContentResponse`` of a recorded request: one candidate per recorded turn."""
    candidates = [
        Candidate(
            content=ReplyContent(parts=reply_parts(reply_parse(profile, conv, r), conv.include_thoughts)),
            finish_reason=finish_reason(r),
            index=i,
        )
        for i, r in enumerate(reply.choices)
    ]
    return GenerateContentResponse(
        candidates=candidates,
        usage_metadata=usage_metadata(profile, conv, reply.choices),
        model_version=model,
        response_id=reply.rid or reply.turn_id,
    )


def error_object(exc: BaseException, message: str) -> tuple[int, dict[str, object]]:
    """(HTTP status, Google's error body) for an exception."""
    status = classify(exc)[0]
    return status, {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


class GeminiStream(StreamRenderer):
    """``data: {GenerateContentResponse}`` chunks of one candidate; the last candidate's carries the usage."""

    def __init__(
        self,
        profile: ModelProfile,
        conv: GeminiConversation,
        rid: str,
        model: str,
        index: int,
        ended: list[ReplyData],
    ) -> None:
        self.profile, self.conv, self.rid, self.model = profile, conv, rid, model
        self.index, self.ended = index, ended

    def _chunk(
        self, parts: list[ReplyPart], finish: str | None = None, usage: UsageMetadata | None = None
    ) -> bytes:
        candidate = Candidate(content=ReplyContent(parts=parts), finish_reason=finish, index=self.index)
        body = GenerateContentResponse(
            candidates=[candidate], usage_metadata=usage, model_version=self.model, response_id=self.rid
        )
        return sse(body.wire())

    def _text_parts(self, reasoning: str, content: str) -> list[ReplyPart]:
        parts = []
        if reasoning and self.conv.include_thoughts:
            parts.append(ReplyPart(text=reasoning, thought=True))
        if content:
            parts.append(ReplyPart(text=content))
        return parts

    def start(self) -> list[bytes]:
        return []

    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        parts = self._text_parts(reasoning, content)
        return [self._chunk(parts)] if parts else []

    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        parts = self._text_parts(reasoning, content)
        tail = reply_parts(parsed, include_thoughts=False, text=False)  # calls, the signature
        self.ended.append(reply)
        last = len(self.ended) == self.conv.n
        usage = usage_metadata(self.profile, self.conv, self.ended) if last else None
        return [self._chunk(parts + tail, finish_reason(reply), usage)]

    def error(self, exc: BaseException, message: str) -> list[bytes]:
        return [sse(error_object(exc, message)[1])]


class GeminiDialect(Dialect):
    """The Gemini API (``generateContent``); ``stream`` is set by the route, not the body."""

    name = "gemini"

    def __init__(self, profile: ModelProfile, model_name: str, stream: bool = False) -> None:
        super().__init__(profile, model_name)
        self.stream = stream

    def token(self, request: Request) -> str | None:
        """The URL token, else ``x-goog-api-key``, else ``?key=``, else the bearer header."""
        if request.path_params.get("token"):
            return url_or_bearer_token(request)
        return (
            request.headers.get("x-goog-api-key")
            or request.query_params.get("key")
            or url_or_bearer_token(request)
        )

    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        return parse_gemini_request(raw, self.stream, default_sampling)

    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, object]:
        assert isinstance(conv, GeminiConversation)
        return response_body(self.profile, conv, reply, self.model_name).wire()

    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        return self.renderers(conv, rid, created, prompt_tokens)[0]

    def renderers(
        self, conv: Conversation, rid: str, created: int, prompt_tokens: int
    ) -> list[StreamRenderer]:
        assert isinstance(conv, GeminiConversation)
        ended: list[ReplyData] = []
        return [GeminiStream(self.profile, conv, rid, self.model_name, i, ended) for i in range(conv.n)]

    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        status, body = error_object(exc, error_message(exc, secrets))
        return JSONResponse(body, status_code=status)
