"""Parsing and validating ``POST /v1/chat/completions`` bodies.

The body is checked by hand (not by a pydantic model) so every problem becomes a
:class:`~dressage.errors.RequestError` naming the OpenAI parameter, which the error seam turns into
a 400 in OpenAI's format; nothing a client sends can produce a 500.

What is honoured: ``messages``, ``tools``, ``tool_choice`` (see below), ``temperature``,
``top_p``, ``top_k`` and ``min_p`` (extra body, SGLang names), ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``stream`` + ``stream_options.include_usage``,
``logprobs`` (without top alternatives), ``chat_template_kwargs.enable_thinking``. What is refused
with 400: ``n > 1``, ``logit_bias``, ``response_format`` other than text, ``audio`` / non-text ``modalities``,
``top_logprobs > 0``, non-zero penalties, legacy ``functions``. Other unknown keys are ignored and
their names recorded on the turn.

``tool_choice``: ``auto`` (default) parses tool calls out of the output; ``none`` keeps the tools in
the prompt (the lineage is not cut) but never parses a call: what the model writes stays content;
``required`` and ``{"type": "function", "function": {"name": N}}`` force the call's opening (see
:mod:`dressage.proxy.recording`); ``required`` with one tool forces that tool's name, with several
the model writes the name.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from dressage.errors import RequestError

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


@dataclass
class ChatRequest:
    """A validated chat-completions request."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    force_tool: str | None
    """``tool_choice`` required / named: the function whose call is forced (``""``: the model names it)."""
    stream: bool
    include_usage: bool
    logprobs: bool
    enable_thinking: bool | None
    model: str | None
    max_tokens: int | None
    sampling: dict[str, Any]
    fingerprint: str
    ignored: list[str] = field(default_factory=list)


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"'{name}' must be a number, got {value!r}", param=name, code="invalid_type")
    if not lo <= value <= hi:
        raise RequestError(
            f"'{name}' must be between {lo} and {hi}, got {value}", param=name, code="invalid_value"
        )
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {value!r}", param=name, code="invalid_type")
    if not lo <= value <= hi:
        raise RequestError(
            f"'{name}' must be between {lo} and {hi}, got {value}", param=name, code="invalid_value"
        )
    return value


def _unsupported(name: str, why: str) -> RequestError:
    return RequestError(f"{why} by this proxy", param=name, code="unsupported_parameter")


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
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or tool.get("type", "function") != "function"
        ):
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools[{i}]",
                code="invalid_value",
            )
    return tools


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> tuple[bool, str | None]:
    """(parse tool calls out of the output?, forced function: a name, ``""`` for any, None for none)."""
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        return tools is not None, None
    if choice == "none":
        return False, None
    names = [t["function"]["name"] for t in tools or ()]
    if choice == "required":
        if not names:
            raise RequestError(
                "tool_choice 'required' needs a non-empty 'tools' array",
                param="tool_choice",
                code="invalid_value",
            )
        return True, names[0] if len(names) == 1 else ""
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise RequestError(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
            param="tool_choice",
            code="invalid_value",
        )
    if name not in names:
        raise RequestError(
            f"tool_choice names function {name!r}, which is not in 'tools' ({', '.join(names) or 'none given'})",
            param="tool_choice",
            code="invalid_value",
        )
    return True, name


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


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object; :class:`RequestError` (``invalid_json``) if not."""
    try:
        body = orjson.loads(raw)  # several times faster than json.loads on a long conversation
    except orjson.JSONDecodeError as e:
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    return body


def parse_chat_request(raw: bytes, default_sampling: dict[str, Any] | None = None) -> ChatRequest:
    """Validate a raw request body; raises :class:`RequestError` (400) for anything wrong."""
    body = parse_json_object(raw)
    for name, why in _UNSUPPORTED.items():
        if body.get(name) not in (None, {}, []):
            raise _unsupported(name, why)
    if body.get("n") not in (None, 1):
        raise _unsupported("n", "n > 1 (several choices per request) is not supported; send n requests")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _unsupported(
            "response_format", "response_format other than text (JSON mode, json_schema) is not supported"
        )
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise _unsupported("modalities", "only the 'text' modality is supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, -2.0, 2.0):
            raise _unsupported(name, f"a non-zero {name} is not supported")
    if _integer(body, "top_logprobs", 0, 20):
        raise _unsupported("top_logprobs", "top_logprobs > 0 is not supported")
    messages = _check_messages(body.get("messages"))
    tools = _check_tools(body.get("tools"))
    parse_tools, force_tool = _tool_choice(body, tools)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean", param="stream", code="invalid_type")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options", code="invalid_type")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError("'logprobs' must be a boolean", param="logprobs", code="invalid_type")
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
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model", code="invalid_type")

    sampling: dict[str, Any] = {}
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0)):
        value = _number(body, name, lo, hi)
        if value is not None:
            sampling[name] = value
    if sampling.get("top_p") == 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p", code="invalid_value")
    top_k = _integer(body, "top_k", -1, 1 << 20)
    if top_k is not None:
        if top_k == 0:
            raise RequestError("'top_k' must be -1 (all) or at least 1", param="top_k", code="invalid_value")
        sampling["top_k"] = top_k
    seed = _integer(body, "seed", -(1 << 63), (1 << 63) - 1)
    if seed is not None:
        sampling["sampling_seed"] = seed
    stops = _stop(body)
    if stops:
        sampling["stop"] = stops
    max_tokens = _integer(body, "max_completion_tokens", 1, 1 << 24)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 1 << 24)
    for key, value in (default_sampling or {}).items():
        if key == "max_new_tokens":
            max_tokens = max_tokens if max_tokens is not None else int(value)
        else:
            sampling.setdefault(key, value)
    ignored = sorted(
        k for k in body if k not in _HANDLED and k not in _UNSUPPORTED and k not in KNOWN_IGNORED
    )
    return ChatRequest(
        messages=messages,
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        logprobs=logprobs,
        enable_thinking=thinking,
        model=model,
        max_tokens=max_tokens,
        sampling=sampling,
        fingerprint=hashlib.sha256(raw).hexdigest(),
        ignored=ignored,
    )
