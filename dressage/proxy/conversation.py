"""The one internal conversation every API dialect parses into, and the checks they share.

A :class:`Conversation` is what TITO planning, generation, recording, segments and retry dedupe
see: the messages in the shape the chat template renders (``role``, ``content``, ``tool_calls``
with function ``name``/``arguments``, ``reasoning_content``, ``tool_call_id``), the function
tools (``{"type": "function", "function": {"name", "description", "parameters"}}``, the shape
the template's tools block renders), the tool choice, sampling, the thinking switch and how the
reply must be parsed. Which dialect asked is recorded (``dialect``) and never consulted by the
shared path: each dialect module (:mod:`dressage.proxy.dialects`) parses its own JSON into this
and renders replies and streams back from the recorded turn.

Every problem becomes a :class:`~dressage.errors.RequestError` naming the parameter, which each
dialect's error seam turns into a 400 in its own error shape.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from dressage.errors import RequestError

DIALECTS = ("chat", "messages", "responses", "gemini")
MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays a request may have (messages, tool schemas, arguments).

Real requests stay far below it (a tool schema rarely passes 10); a body built to be deep would
otherwise reach recursive code (rendering, canonical JSON) and fail there."""


@dataclass
class Conversation:
    """A validated request, dialect-blind: what the shared turn path needs."""

    dialect: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    """Parse tool calls out of the output (tools given and tool choice not ``none``)."""
    force_tool: str | None
    """Tool choice required / named: the function whose call is forced (``""``: the model names it)."""
    stream: bool
    enable_thinking: bool | None
    model: str | None
    max_tokens: int | None
    sampling: dict[str, Any]
    fingerprint: str
    logprobs: bool = False
    include_usage: bool = False
    ignored: list[str] = field(default_factory=list)
    """Request fields accepted without effect on generation; recorded on the turn."""
    info: dict[str, Any] = field(default_factory=dict)
    """Dialect facts recorded on the turn (e.g. hosted tools dropped, a Responses chain)."""
    n: int = 1
    """Choices to generate from the one prompt (chat ``n``); each is recorded as its own turn."""
    top_logprobs: int = 0
    """Alternatives per generated token to return with the logprobs (SGLang's ``top_logprobs_num``)."""


def fingerprint(dialect: str, raw: bytes) -> str:
    """The retry-dedupe fingerprint of a body: sha256 over the dialect and the raw bytes."""
    return hashlib.sha256(dialect.encode() + b"\0" + raw).hexdigest()


def parse_json_object(raw: bytes) -> dict[str, object]:
    """Decode a request body that must be a JSON object; :class:`RequestError` (``invalid_json``) if not."""
    try:
        body = orjson.loads(raw)  # several times faster than json.loads on a long conversation
    except orjson.JSONDecodeError as e:
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    check_depth(body, "the request body")
    return body


def check_depth(value: Any, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit``, level by level (the check itself cannot recurse)."""
    level, depth = [value], 1
    while level:
        if depth > limit:
            raise RequestError(
                f"{what} is nested deeper than {limit} levels of objects and arrays", code="too_deep"
            )
        deeper = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    deeper.append(child)
        level, depth = deeper, depth + 1


def integer(body: dict[str, object], name: str, lo: int, hi: int) -> int | None:
    """``body[name]`` as an integer in ``[lo, hi]``, None when absent."""
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


def unsupported(name: str, why: str) -> RequestError:
    """The 400 for a field this proxy does not honour."""
    return RequestError(f"{why} by this proxy", param=name, code="unsupported_parameter")


def refuse_unknown(body: dict[str, object], known: frozenset[str], dialect: str) -> None:
    """Refuse any top-level field the dialect does not know: nothing is silently ignored."""
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise RequestError(
            f"unknown parameter(s) {', '.join(unknown)} for the {dialect} API are not supported by this proxy",
            param=unknown[0],
            code="unknown_parameter",
        )


def function_tool(name: object, description: object, parameters: object, where: str) -> dict[str, Any]:
    """One internal function tool, validated: a name, an optional description, an object schema."""
    if not isinstance(name, str) or not name:
        raise RequestError(
            f"{where}.name must be a non-empty string", param=f"{where}.name", code="invalid_value"
        )
    if description is not None and not isinstance(description, str):
        raise RequestError(
            f"{where}.description must be a string", param=f"{where}.description", code="invalid_type"
        )
    if parameters is not None and not isinstance(parameters, dict):
        raise RequestError(
            f"{where} parameters must be a JSON Schema object, got {type(parameters).__name__}",
            param=where,
            code="invalid_type",
        )
    fn: dict[str, object] = {"name": name}
    if description is not None:
        fn["description"] = description
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def resolve_tool_choice(
    mode: str, name: object, tools: list[dict[str, Any]] | None, param: str
) -> tuple[bool, str | None]:
    """(parse tool calls?, forced function) for a tool choice in dialect-neutral terms.

    ``mode``: ``auto``, ``none``, ``required`` (any tool) or ``named`` (``name``). ``required`` with
    one tool forces that tool's name; with several, the model writes the name.
    """
    names = [t["function"]["name"] for t in tools or ()]
    if mode == "auto":
        return tools is not None, None
    if mode == "none":
        return False, None
    if not names:
        raise RequestError(
            f"{param} {mode!r} needs a non-empty tools array", param=param, code="invalid_value"
        )
    if mode == "required":
        return True, names[0] if len(names) == 1 else ""
    if not isinstance(name, str) or name not in names:
        raise RequestError(
            f"{param} names function {name!r}, which is not in the tools ({', '.join(names)})",
            param=param,
            code="invalid_value",
        )
    return True, name


def merge_defaults(
    sampling: dict[str, object], max_tokens: int | None, defaults: Mapping[str, object] | None
) -> int | None:
    """Fill the run's default sampling under what the request set; returns the max-tokens cap."""
    for key, value in (defaults or {}).items():
        if key == "max_new_tokens":
            if max_tokens is None:
                assert isinstance(value, int | float | str), f"max_new_tokens default {value!r}"
                max_tokens = int(value)
        else:
            sampling.setdefault(key, value)
    return max_tokens


def text_of(content: object, where: str) -> str:
    """Plain text from a string or a list of text parts/blocks (any ``text`` field)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(
            f"{where} must be a string or an array of text parts", param=where, code="invalid_type"
        )
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise RequestError(
                f"{where}[{i}] must be a text part with a string 'text'",
                param=f"{where}[{i}]",
                code="invalid_value",
            )
        out.append(part["text"])
    return "".join(out)


def hoist_system(system: list[str], messages: list[dict[str, Any]]) -> list[dict[str, object]]:
    """One leading system message from ``system`` texts and every system/developer message, in order.

    The chat templates render a system prompt only at the start (Qwen3.5 refuses one elsewhere),
    while Claude Code sends a ``system`` message after the first user message and Codex sends
    ``developer`` items: their text joins the leading system prompt (blank line between parts),
    where the model reads instructions. A client that sends them identically every request keeps
    the prompt's prefix stable, so its turns still append.
    """
    texts = [t for t in system if t]
    rest = []
    for msg in messages:
        if msg.get("role") in ("system", "developer"):
            texts.append(str(msg.get("content") or ""))
        else:
            rest.append(msg)
    return ([{"role": "system", "content": "\n\n".join(texts)}] if texts else []) + rest


def thinking_token_count(ids: list[int], think_end_id: int | None, think_open: bool = False) -> int:
    """Generated tokens up to and including the think-closing token.

    Without one: every generated token when the generation prompt opened a thinking block
    (``think_open``: the output ended inside it, e.g. at ``max_tokens``), else 0.
    """
    if think_end_id is None or think_end_id not in ids:
        return len(ids) if think_open and think_end_id is not None else 0
    return ids.index(think_end_id) + 1
