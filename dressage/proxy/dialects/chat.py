"""The OpenAI chat-completions dialect: ``POST /v1/chat/completions``.

What is honoured: ``messages``, ``tools``, ``tool_choice`` (see below), ``temperature``,
``top_p``, ``top_k`` and ``min_p`` (extra body, SGLang names), ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``stream`` + ``stream_options.include_usage``,
``logprobs`` (without top alternatives), ``chat_template_kwargs.enable_thinking``. What is refused
with 400: ``n > 1``, ``logit_bias``, ``response_format`` other than text, ``audio`` / non-text
``modalities``, ``top_logprobs > 0``, non-zero penalties, legacy ``functions``. Other unknown keys
are accepted and their names recorded on the turn (``info.ignored_params``).

``tool_choice``: ``auto`` (default) parses tool calls out of the output; ``none`` keeps the tools in
the prompt (the lineage is not cut) but never parses a call: what the model writes stays content;
``required`` and ``{"type": "function", "function": {"name": N}}`` force the call's opening (see
:mod:`dressage.proxy.recording`); ``required`` with one tool forces that tool's name, with several
the model writes the name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    boolean,
    fingerprint,
    function_tool,
    integer,
    merge_defaults,
    number,
    parse_json_object,
    resolve_tool_choice,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer
from dressage.proxy.errors import classify, error_body, error_response
from dressage.proxy.replies import reply_parse
from dressage.proxy.sessions import ReplyData, SessionState
from dressage.proxy.streaming import sse
from dressage.tito.profiles import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant

ROLES = ("system", "developer", "user", "assistant", "tool")
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
    "repetition_penalty": "repetition_penalty is not supported",
}
_HANDLED = frozenset(
    {"messages", "tools", "tool_choice", "temperature", "top_p", "top_k", "min_p", "max_tokens",
     "max_completion_tokens", "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs",
     "chat_template_kwargs", "n", "response_format", "modalities", "presence_penalty",
     "frequency_penalty"}
)  # fmt: skip


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array", param="messages", code="invalid_type")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestError(
                f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type"
            )
        role = msg.get("role")
        if role not in ROLES:
            raise RequestError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(
                f"messages[{i}].content must be a string or an array of parts",
                param=f"messages[{i}].content",
                code="invalid_type",
            )
        calls = msg.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise RequestError(
                f"messages[{i}].tool_calls must be an array",
                param=f"messages[{i}].tool_calls",
                code="invalid_type",
            )
    return messages


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestError("'tools' must be an array", param="tools", code="invalid_type")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools[{i}]",
                code="invalid_value",
            )
        checked = function_tool(
            fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}].function"
        )
        out.append({**tool, "function": {**fn, **checked["function"]}})
    return out


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> tuple[bool, str | None]:
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        return resolve_tool_choice(choice or "auto", None, tools, "tool_choice")
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise RequestError(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
            param="tool_choice",
            code="invalid_value",
        )
    return resolve_tool_choice("named", name, tools, "tool_choice")


def _stop(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise RequestError(
            "'stop' must be a non-empty string or an array of up to 4", param="stop", code="invalid_value"
        )
    return stops


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, why in _UNSUPPORTED.items():
        if body.get(name) not in (None, {}, []):
            raise unsupported(name, why)
    if body.get("n") not in (None, 1):
        raise unsupported("n", "n > 1 (several choices per request) is not supported; send n requests")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise unsupported(
            "response_format", "response_format other than text (JSON mode, json_schema) is not supported"
        )
    if body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities", "only the 'text' modality is supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if number(body, name, -2.0, 2.0):
            raise unsupported(name, f"a non-zero {name} is not supported")
    if integer(body, "top_logprobs", 0, 20):
        raise unsupported("top_logprobs", "top_logprobs > 0 is not supported")


def _thinking(body: dict[str, Any]) -> bool | None:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError(
            "'chat_template_kwargs' must be an object", param="chat_template_kwargs", code="invalid_type"
        )
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise RequestError(
            "enable_thinking must be a boolean",
            param="chat_template_kwargs.enable_thinking",
            code="invalid_type",
        )
    return thinking


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0)):
        value = number(body, name, lo, hi)
        if value is not None:
            sampling[name] = value
    if sampling.get("top_p") == 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p", code="invalid_value")
    top_k = integer(body, "top_k", -1, 1 << 20)
    if top_k is not None:
        if top_k == 0:
            raise RequestError("'top_k' must be -1 (all) or at least 1", param="top_k", code="invalid_value")
        sampling["top_k"] = top_k
    seed = integer(body, "seed", -(1 << 63), (1 << 63) - 1)
    if seed is not None:
        sampling["sampling_seed"] = seed
    stops = _stop(body)
    if stops:
        sampling["stop"] = stops
    return sampling


def parse_chat_request(raw: bytes, default_sampling: dict[str, Any] | None = None) -> Conversation:
    """Validate a raw chat-completions body; raises :class:`RequestError` (400) for anything wrong."""
    body = parse_json_object(raw)
    _refuse_unsupported(body)
    messages = _check_messages(body.get("messages"))
    tools = _check_tools(body.get("tools"))
    parse_tools, force_tool = _tool_choice(body, tools)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options", code="invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model", code="invalid_type")
    sampling = _sampling(body)
    max_tokens = integer(body, "max_completion_tokens", 1, 1 << 24)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", 1, 1 << 24)
    max_tokens = merge_defaults(sampling, max_tokens, default_sampling)
    ignored = sorted(
        k for k in body if k not in _HANDLED and k not in _UNSUPPORTED and k not in KNOWN_IGNORED
    )
    return Conversation(
        dialect="chat",
        messages=messages,
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=boolean(body, "stream"),
        include_usage=bool(opts.get("include_usage")),
        logprobs=boolean(body, "logprobs"),
        enable_thinking=_thinking(body),
        model=model,
        max_tokens=max_tokens,
        sampling=sampling,
        fingerprint=fingerprint("chat", raw),
        ignored=ignored,
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


def logprobs_content(
    profile: ModelProfile, ids: Sequence[int], logprobs: Sequence[float]
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content``: one entry per generated token (stop token included)."""
    tok = profile.tokenizer
    out = []
    for token_id, lp in zip(ids, logprobs, strict=True):
        text = tok.decode([token_id])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def completion_body(
    profile: ModelProfile, conv: Conversation, reply: ReplyData, model: str
) -> tuple[dict[str, Any], ParsedAssistant]:
    """The ``chat.completion`` object of a recorded turn, and its parse."""
    parsed = reply_parse(profile, conv, reply)
    choice: dict[str, Any] = {
        "index": 0,
        "message": parsed.to_message(),
        "finish_reason": finish_reason(reply.stop_reason, parsed),
        "logprobs": None,
    }
    if conv.logprobs:
        choice["logprobs"] = {"content": logprobs_content(profile, reply.generated_ids, reply.logprobs)}
    body = {
        "id": f"chatcmpl-{reply.rid or reply.turn_id}",
        "object": "chat.completion",
        "created": reply.created,
        "model": model,
        "choices": [choice],
        "usage": usage(reply.prompt_tokens, len(reply.generated_ids)),
    }
    return body, parsed


def chunk(
    completion_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A ``chat.completion.chunk`` with one choice."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
    }


def tool_call_deltas(tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``delta`` carrying every parsed tool call, whole, with its index."""
    return {"tool_calls": [{"index": i, **call} for i, call in enumerate(tool_calls)]}


class ChatStream(StreamRenderer):
    """``chat.completion.chunk`` events, ``[DONE]`` last."""

    def __init__(self, profile: ModelProfile, conv: Conversation, cid: str, created: int, model: str) -> None:
        self.profile, self.conv = profile, conv
        self.cid, self.created, self.model = cid, created, model

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> bytes:
        return sse(chunk(self.cid, self.created, self.model, delta, finish, logprobs=lp))

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        lp = logprobs_content(self.profile, ids, logprobs) if self.conv.logprobs and ids else None
        delta = {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v}
        return [self._chunk(delta, lp=lp)] if delta or lp else []

    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        out = self.delta(reasoning, content, [], [])
        if parsed.tool_calls:
            out.append(self._chunk(tool_call_deltas(parsed.tool_calls)))
        out.append(self._chunk({}, finish_reason(reply.stop_reason, parsed)))
        if self.conv.include_usage:
            body = chunk(self.cid, self.created, self.model, {})
            body["choices"], body["usage"] = [], usage(reply.prompt_tokens, len(reply.generated_ids))
            out.append(sse(body))
        out.append(sse("[DONE]"))
        return out

    def error(self, exc: BaseException, message: str) -> list[bytes]:
        _, type_, param, code = classify(exc)
        return [sse(error_body(message, type_, param, code)), sse("[DONE]")]


class ChatDialect(Dialect):
    """OpenAI chat completions."""

    name = "chat"

    def parse(self, raw: bytes, state: SessionState, default_sampling: dict[str, Any] | None) -> Conversation:
        return parse_chat_request(raw, default_sampling)

    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, Any]:
        return completion_body(self.profile, conv, reply, self.model_name)[0]

    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        return ChatStream(self.profile, conv, f"chatcmpl-{rid}", created, self.model_name)

    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        return error_response(exc, secrets)
