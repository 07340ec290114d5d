"""The OpenAI chat-completions dialect: ``POST /v1/chat/completions``.

What is honoured: ``messages``, ``tools``, ``tool_choice`` (see below), ``temperature``,
``top_p``, ``top_k`` and ``min_p`` (extra body, SGLang names), ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``stream`` + ``stream_options.include_usage``,
``logprobs`` + ``top_logprobs`` (0-20; sent to the engine as SGLang's ``top_logprobs_num``),
``n`` (1-16 choices from one prompt, each recorded as its own turn: see
:mod:`dressage.proxy.recording`), ``frequency_penalty`` / ``presence_penalty`` ([-2, 2]) and
``repetition_penalty`` ((0, 2], extra body) as SGLang sampling params,
``chat_template_kwargs.enable_thinking``, and one output constraint for SGLang's constrained
decoding: ``response_format`` ``json_object`` (SGLang's ``json_schema`` ``{"type": "object"}``) or
``json_schema`` (its ``schema``), SGLang's ``regex`` / ``ebnf`` (extra body), or vLLM's
``structured_outputs`` (``json``, ``regex``, ``choice`` (an EBNF alternation of the literal
strings), ``grammar`` (EBNF)). With thinking on, the grammar applies after ``</think>`` (SGLang's
``require_reasoning``). A constraint together with a forced tool call (``tool_choice`` required or
named) is refused, as SGLang refuses it.

What is refused with 400: ``logit_bias``, ``response_format`` ``structural_tag``, ``audio`` /
non-text ``modalities``, legacy ``functions``, ``stream_options`` without ``stream``,
``stream_options.continuous_usage_stats``, ``top_logprobs`` without ``logprobs``. Other unknown
keys are accepted and their names recorded on the turn (``info.ignored_params``).

The reply: ``choices`` in choice order; a message's reasoning under both ``reasoning_content``
(SGLang) and ``reasoning`` (vLLM), and in a stream both keys are in every delta (``null`` when the
delta has no reasoning); a forced tool call's ``content`` is ``""`` (vLLM's shape), an automatic
one's ``null``; a reply that is only reasoning (``max_tokens`` reached inside the thinking block,
``finish_reason`` ``length``) has ``content`` ``null`` and the partial reasoning, as SGLang and
vLLM answer. ``logprobs.content`` has one entry per generated token, *including* the
think-closing ``</think>`` and the final end token (``<|im_end|>``), which ``completion_tokens``
counts too, so ``len(logprobs.content) == completion_tokens``; a forced tool call's opening is
not generated (it counts as prompt) and has no entry. Logprobs below OpenAI's floor (``-9999.0``,
e.g. tokens a grammar masked) are reported as ``-9999.0``.

``tool_choice``: ``auto`` (default) parses tool calls out of the output; ``none`` keeps the tools in
the prompt (the lineage is not cut) but never parses a call: what the model writes stays content;
``required`` and ``{"type": "function", "function": {"name": N}}`` force a call (see
:mod:`dressage.proxy.recording`): with thinking off the call's opening is written into the prompt
(``required`` with one tool forces that tool's name, with several the model writes the name);
with thinking on the model thinks first and a grammar after ``</think>`` forces a call of the
named function (or of one of the tools), as SGLang and vLLM force it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    fingerprint,
    merge_defaults,
    parse_json_object,
    resolve_tool_choice,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer
from dressage.proxy.dialects.chat_models import RULES, ChatMessage, ChatRequest
from dressage.proxy.dialects.request_schema import validate_request
from dressage.proxy.errors import classify, error_body, error_response
from dressage.proxy.replies import reply_parse
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import SessionState
from dressage.proxy.streaming import sse
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant

KNOWN_IGNORED = frozenset(
    {"model", "user", "metadata", "store", "parallel_tool_calls", "service_tier", "reasoning_effort",
     "prompt_cache_key", "safety_identifier", "verbosity"}
)  # fmt: skip
_UNSUPPORTED = {
    "audio": "audio output is not supported",
    "functions": "legacy 'functions' is not supported; use 'tools'",
    "function_call": "legacy 'function_call' is not supported; use 'tool_choice'",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "logit_bias": "logit_bias is not supported",
}
_NOT_RECORDED = KNOWN_IGNORED | _UNSUPPORTED.keys() | {"modalities"}
"""Extra fields left off ``info.ignored_params``: refused before, known to change nothing, or checked."""
LOGPROB_FLOOR = -9999.0
"""OpenAI's smallest reported logprob (vLLM clamps to it too)."""


def _messages(messages: list[ChatMessage]) -> list[dict[str, object]]:
    """The messages for the template; vLLM clients send an assistant's reasoning back as ``reasoning``,
    the template reads ``reasoning_content``."""
    out = cast(list[dict[str, object]], messages)  # plain dicts pydantic-core built: ours to complete
    for m in out:
        if m["role"] == "assistant" and m.get("reasoning") is not None and m.get("reasoning_content") is None:
            m["reasoning_content"] = m["reasoning"]
    return out


def _tool_choice(req: ChatRequest, tools: list[dict[str, object]] | None) -> tuple[bool, str | None]:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return resolve_tool_choice(choice or "auto", None, tools, "tool_choice")
    return resolve_tool_choice("named", choice["function"]["name"], tools, "tool_choice")


def _refuse_unsupported(body: dict[str, object]) -> None:
    for name, why in _UNSUPPORTED.items():
        if body.get(name) not in (None, {}, []):
            raise unsupported(name, why)
    if body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities", "only the 'text' modality is supported")


def _string(value: object, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(f"'{param}' must be a non-empty string", param=param, code="invalid_type")
    return value


def _response_format(fmt: dict[str, object]) -> tuple[str, str] | None:
    """OpenAI ``response_format`` as an SGLang grammar param (None for ``text``)."""
    kind = fmt.get("type")
    if not isinstance(kind, str):
        raise RequestError(
            "'response_format' must be an object with a 'type'", param="response_format", code="invalid_type"
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", '{"type": "object"}'
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError(
                "response_format json_schema needs 'json_schema.schema' (a JSON Schema object)",
                param="response_format.json_schema.schema",
                code="invalid_value",
            )
        return "json_schema", json.dumps(schema, ensure_ascii=False)
    if kind == "structural_tag":
        raise unsupported("response_format", "response_format 'structural_tag' is not supported")
    raise RequestError(
        f"response_format.type must be text, json_object or json_schema, got {kind!r}",
        param="response_format.type",
        code="invalid_value",
    )


def _structured_outputs(spec: dict[str, object]) -> tuple[str, str]:
    """vLLM's ``structured_outputs`` (one of json / regex / choice / grammar) as an SGLang grammar param."""
    param = "structured_outputs"
    given = {k: v for k, v in spec.items() if v not in (None, False)}
    known = {"json", "regex", "choice", "grammar", "json_object"}
    for key in given:
        if key not in known:
            raise unsupported(
                f"{param}.{key}", f"{param}.{key} is not supported (use json, regex, choice, grammar)"
            )
    if len(given) != 1:
        raise RequestError(
            f"'{param}' must set exactly one of {', '.join(sorted(known))}", param=param, code="invalid_value"
        )
    key, value = next(iter(given.items()))
    if key == "json":
        try:
            schema = json.loads(value) if isinstance(value, str) else value
        except ValueError as e:
            raise RequestError(
                f"'{param}.json' is not valid JSON: {e}", param=f"{param}.json", code="invalid_value"
            ) from e
        if not isinstance(schema, dict):
            raise RequestError(
                f"'{param}.json' must be a JSON Schema object", param=f"{param}.json", code="invalid_type"
            )
        return "json_schema", json.dumps(schema, ensure_ascii=False)
    if key == "json_object":
        return "json_schema", '{"type": "object"}'
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise RequestError(
                f"'{param}.choice' must be a non-empty array of non-empty strings",
                param=f"{param}.choice",
                code="invalid_value",
            )
        return "ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    return ("regex" if key == "regex" else "ebnf"), _string(value, f"{param}.{key}")


def _constraint(req: ChatRequest, force_tool: str | None) -> dict[str, str]:
    """The one output constraint of the request as SGLang sampling params (``json_schema``/``regex``/``ebnf``)."""
    found: list[tuple[str, tuple[str, str]]] = []
    if req.response_format is not None:
        fmt = _response_format(req.response_format)
        if fmt is not None:
            found.append(("response_format", fmt))
    for name, value in (("regex", req.regex), ("ebnf", req.ebnf)):
        if value is not None:
            found.append((name, (name, value)))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", _structured_outputs(req.structured_outputs)))
    if not found:
        return {}
    if len(found) > 1:
        raise RequestError(
            f"only one output constraint may be set, got {', '.join(name for name, _ in found)}",
            param=found[1][0],
            code="invalid_value",
        )
    name, (kind, source) = found[0]
    if force_tool is not None:
        raise RequestError(
            f"tool_choice 'required' or a named tool cannot be combined with {name}: the tool-call "
            "constraint and the output constraint cannot both be honoured",
            param=name,
            code="invalid_value",
        )
    return {kind: source}


def _cross_checks(req: ChatRequest) -> None:
    """What one field's schema cannot say: ranges open at one end, fields that need another."""
    if req.stream_options is not None and not req.stream:
        raise RequestError(
            "'stream_options' is only allowed when 'stream' is true",
            param="stream_options",
            code="invalid_value",
        )
    if req.stream_options and req.stream_options.get("continuous_usage_stats"):
        raise unsupported("stream_options.continuous_usage_stats", "usage in every chunk is not supported")
    if req.top_logprobs and not req.logprobs:
        raise RequestError(
            "'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value"
        )
    if req.top_p == 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p", code="invalid_value")
    if req.top_k == 0:
        raise RequestError("'top_k' must be -1 (all) or at least 1", param="top_k", code="invalid_value")
    if req.repetition_penalty == 0.0:
        raise RequestError(
            "'repetition_penalty' must be in (0, 2] (1 = none)",
            param="repetition_penalty",
            code="invalid_value",
        )


def _sampling(req: ChatRequest) -> dict[str, object]:
    """The SGLang sampling params the request sets (penalties only when they change anything)."""
    given = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "min_p": req.min_p,
        "top_k": req.top_k,
        "sampling_seed": req.seed,
        "frequency_penalty": req.frequency_penalty or None,
        "presence_penalty": req.presence_penalty or None,
        "repetition_penalty": None if req.repetition_penalty == 1.0 else req.repetition_penalty,
        "stop": [req.stop] if isinstance(req.stop, str) else req.stop or None,
    }
    return {k: v for k, v in given.items() if v is not None}


def parse_chat_request(raw: bytes, default_sampling: Mapping[str, object] | None = None) -> Conversation:
    """Validate a raw chat-completions body; raises :class:`RequestError` (400) for anything wrong."""
    body = parse_json_object(raw)
    _refuse_unsupported(body)
    req = validate_request(ChatRequest, body, RULES)
    tools = cast(list[dict[str, object]], req.tools) if req.tools else None
    parse_tools, force_tool = _tool_choice(req, tools)
    _cross_checks(req)
    sampling = _sampling(req)
    sampling.update(_constraint(req, force_tool))
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    kwargs = req.chat_template_kwargs or {}
    return Conversation(
        dialect="chat",
        messages=_messages(req.messages),
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.get("include_usage")),
        logprobs=bool(req.logprobs),
        top_logprobs=req.top_logprobs or 0,
        n=req.n or 1,
        enable_thinking=kwargs.get("enable_thinking"),
        model=req.model,
        max_tokens=merge_defaults(sampling, max_tokens, default_sampling),
        sampling=sampling,
        fingerprint=fingerprint("chat", raw),
        ignored=sorted(k for k in req.model_extra or () if k not in _NOT_RECORDED),
    )


# --- replies ----------------------------------------------------------------------------------------


def finish_reason(stop_reason: str, parsed: ParsedAssistant) -> str:
    """OpenAI finish reason: ``tool_calls`` when calls were parsed, else ``stop`` / ``length``."""
    if parsed.tool_calls and stop_reason == "stop":
        return "tool_calls"
    return "length" if stop_reason == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI usage object (counts agree with the log: prompt = segment tokens before generation)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choices_usage(replies: Sequence[ReplyData]) -> dict[str, int]:
    """Usage of a request's choices: the prompt once (they share it), every choice's generated tokens."""
    return usage(replies[0].prompt_tokens, sum(len(r.generated_ids) for r in replies))


def _entry(profile: ModelProfile, token_id: int, lp: float) -> dict[str, object]:
    text = profile.tokenizer.decode([token_id])
    return {"token": text, "logprob": max(lp, LOGPROB_FLOOR), "bytes": list(text.encode())}


def logprobs_content(
    profile: ModelProfile,
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> list[dict[str, object]]:
    """OpenAI ``logprobs.content``: one entry per generated token (``</think>`` and the stop token included)."""
    out = []
    for i, (token_id, lp) in enumerate(zip(ids, logprobs, strict=True)):
        entry = _entry(profile, token_id, lp)
        entry["top_logprobs"] = [_entry(profile, t, v) for t, v in top[i]] if top is not None else []
        out.append(entry)
    return out


def assistant_message(conv: Conversation, parsed: ParsedAssistant) -> dict[str, object]:
    """The OpenAI assistant message: reasoning under both keys; a forced call's content ``""``.

    An output that is only reasoning (``max_tokens`` reached inside the thinking block) has
    ``content`` ``null``, as SGLang's and vLLM's reasoning parsers answer: the partial reasoning
    is the reply.
    """
    msg = parsed.to_message()
    if "reasoning_content" in msg:
        msg["reasoning"] = msg["reasoning_content"]
        if msg["content"] == "" and not parsed.tool_calls:
            msg["content"] = None
    if conv.force_tool is not None and parsed.tool_calls and msg.get("content") is None:
        msg["content"] = ""
    return msg


def _choice(profile: ModelProfile, conv: Conversation, reply: ReplyData, index: int) -> dict[str, object]:
    parsed = reply_parse(profile, conv, reply)
    choice: dict[str, object] = {
        "index": index,
        "message": assistant_message(conv, parsed),
        "finish_reason": finish_reason(reply.stop_reason, parsed),
        "logprobs": None,
    }
    if conv.logprobs:
        top = reply.top_logprobs if conv.top_logprobs else None
        choice["logprobs"] = {"content": logprobs_content(profile, reply.generated_ids, reply.logprobs, top)}
    return choice


def completion_body(
    profile: ModelProfile, conv: Conversation, reply: ReplyData, model: str
) -> dict[str, object]:
    """The ``chat.completion`` object of a recorded request: one choice per recorded turn."""
    replies = reply.choices
    return {
        "id": f"chatcmpl-{reply.rid or reply.turn_id}",
        "object": "chat.completion",
        "created": reply.created,
        "model": model,
        "choices": [_choice(profile, conv, r, i) for i, r in enumerate(replies)],
        "usage": choices_usage(replies),
    }


def chunk(
    completion_id: str, created: int, model: str, delta: dict[str, object], finish_reason: str | None = None,
    logprobs: list[dict[str, object]] | None = None, index: int = 0,
) -> dict[str, object]:  # fmt: skip
    """A ``chat.completion.chunk`` with one choice."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": delta,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
    }


def tool_call_deltas(tool_calls: list[dict[str, object]]) -> list[dict[str, object]]:
    """Every parsed tool call, whole, with its index (the ``tool_calls`` of a delta)."""
    return [{"index": i, **call} for i, call in enumerate(tool_calls)]


class ChatStream(StreamRenderer):
    """``chat.completion.chunk`` events of one choice; the last choice's renderer ends the stream.

    A text delta has ``content``, ``reasoning_content`` and ``reasoning`` (``null`` when absent).
    The latest text delta is held until the next one (or the end), so the chunk with the
    ``finish_reason`` carries the last text, as vLLM's does; logprobs of tokens whose text is not
    stable yet ride on the next text delta.
    """

    def __init__(
        self,
        profile: ModelProfile,
        conv: Conversation,
        cid: str,
        created: int,
        model: str,
        index: int = 0,
        ended: list[ReplyData] | None = None,
    ) -> None:
        self.profile, self.conv = profile, conv
        self.cid, self.created, self.model = cid, created, model
        self.index = index
        self.ended = ended if ended is not None else []
        """Replies of the request's choices streamed so far (shared by its renderers, for usage)."""
        self._held: tuple[str, str, list[dict[str, object]] | None] | None = None
        self._lp: list[dict[str, object]] = []
        self._pending_top: list[list[tuple[int, float]]] | None = None

    def _chunk(
        self, delta: dict[str, object], finish: str | None = None, lp: list[dict[str, object]] | None = None
    ) -> bytes:
        return sse(chunk(self.cid, self.created, self.model, delta, finish, logprobs=lp, index=self.index))

    @staticmethod
    def _text_delta(reasoning: str, content: str) -> dict[str, object]:
        return {
            "content": content or None,
            "reasoning_content": reasoning or None,
            "reasoning": reasoning or None,
        }

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        if self.conv.logprobs and ids:
            top, self._pending_top = self._pending_top, None
            self._lp += logprobs_content(self.profile, ids, logprobs, top)
        if not (reasoning or content):
            return []
        out = self._release()
        self._held = (reasoning, content, self._take_lp())
        return out

    def alternatives(self, top: list[list[tuple[int, float]]]) -> None:
        self._pending_top = top

    def _take_lp(self) -> list[dict[str, object]] | None:
        lp, self._lp = (self._lp or None), []
        return lp if self.conv.logprobs else None

    def _release(self) -> list[bytes]:
        if self._held is None:
            return []
        reasoning, content, lp = self._held
        self._held = None
        return [self._chunk(self._text_delta(reasoning, content), lp=lp)]

    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        held_r, held_c, held_lp = self._held or ("", "", None)
        self._held = None
        lp = [*(held_lp or []), *self._lp] if self.conv.logprobs else None
        self._lp = []
        delta = self._text_delta(held_r + reasoning, held_c + content)
        if parsed.tool_calls:
            delta["tool_calls"] = tool_call_deltas(parsed.tool_calls)
            if self.conv.force_tool is not None and delta["content"] is None:
                delta["content"] = ""
        out = [self._chunk(delta, finish_reason(reply.stop_reason, parsed), lp=lp or None)]
        self.ended.append(reply)
        if len(self.ended) < self.conv.n:
            return out
        if self.conv.include_usage:
            body = chunk(self.cid, self.created, self.model, {})
            body["choices"], body["usage"] = [], choices_usage(self.ended)
            out.append(sse(body))
        out.append(sse("[DONE]"))
        return out

    def error(self, exc: BaseException, message: str) -> list[bytes]:
        _, type_, param, code = classify(exc)
        return [sse(error_body(message, type_, param, code)), sse("[DONE]")]


class ChatDialect(Dialect):
    """OpenAI chat completions."""

    name = "chat"

    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        return parse_chat_request(raw, default_sampling)

    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, object]:
        return completion_body(self.profile, conv, reply, self.model_name)

    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        return ChatStream(self.profile, conv, f"chatcmpl-{rid}", created, self.model_name)

    def renderers(
        self, conv: Conversation, rid: str, created: int, prompt_tokens: int
    ) -> list[StreamRenderer]:
        ended: list[ReplyData] = []
        return [
            ChatStream(self.profile, conv, f"chatcmpl-{rid}", created, self.model_name, index=i, ended=ended)
            for i in range(conv.n)
        ]

    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        return error_response(exc, secrets)
