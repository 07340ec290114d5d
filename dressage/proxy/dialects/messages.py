"""The Anthropic Messages dialect: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Served at ``/s/<token>/v1/messages`` (Claude Code appends ``/v1/messages?beta=true`` to
``ANTHROPIC_BASE_URL``, so a session's base is ``http://host:port/s/<token>``) and at
``/v1/messages`` with the token in ``x-api-key`` or ``Authorization: Bearer``.

Request -> shared conversation:

- ``system`` (a string or text blocks) and every ``role: "system"`` message inside ``messages``
  become the one leading system prompt (:func:`~dressage.proxy.conversation.hoist_system`);
  ``cache_control`` is accepted anywhere and has no effect (the engine's prefix cache is automatic).
- user content: text blocks are the user message; ``tool_result`` blocks (string or text-block
  content) become tool messages in their order, answering the ``tool_use`` with their id.
  ``is_error`` is accepted; the chat template has no slot for it, so the result's text (Claude Code
  writes ``<tool_use_error>`` into it) is what the model reads. Images and documents are refused.
- assistant content: ``thinking`` blocks are the reasoning, ``text`` blocks the content,
  ``tool_use`` blocks the tool calls (``input`` rendered by the template exactly as a chat
  completions call would be): the same message a chat-completions client sends back, so a turn is
  token-exact under the same rules.
- ``tools`` (custom tools: ``name``, ``description``, ``input_schema``; other fields such as
  ``defer_loading`` or ``cache_control`` accepted without effect); server tools (``type`` other
  than ``custom``) are refused: this proxy runs no tools.
- ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none``; ``thinking`` ``enabled`` / ``adaptive``
  turn the template's thinking switch on, ``disabled`` off, absent leaves the template default;
  ``budget_tokens`` is not enforced (recorded as ignored). ``any`` / ``tool`` with thinking on: the
  model thinks first, then a grammar forces the call (as SGLang and vLLM force it; Anthropic's API
  refuses the pair, this proxy serves it: see :mod:`dressage.proxy.recording`).
- ``max_tokens`` (required), ``stop_sequences``, ``temperature`` (0-1), ``top_p``, ``top_k``,
  ``metadata`` (recorded as ignored), ``stream``.
- Claude Code 2.1 also sends ``output_config: {effort}`` (adaptive thinking's effort: the template's
  thinking switch has no effort, so it is recorded as ignored; any other ``output_config`` key, such
  as a structured-output ``format``, is refused) and ``context_management: {edits: [...]}``.
  ``clear_thinking_*`` edits are accepted and recorded as ignored (the Qwen3.5 template already
  renders reasoning only for the turns after the last user message, whatever the edit keeps);
  other edits (``clear_tool_uses_*``, which would drop tool results) are refused.

Replies are ``Message`` objects (``thinking`` block with a signature, ``text`` block, ``tool_use``
blocks; ``stop_reason`` ``end_turn`` / ``tool_use`` / ``max_tokens`` / ``stop_sequence``) or
the event stream ``message_start``, ``ping``, ``content_block_start`` / ``_delta``
(``thinking_delta``, ``text_delta``, ``input_json_delta``) / ``_stop``, ``message_delta``,
``message_stop``; errors in Anthropic's shape (``{"type": "error", "error": {type, message}}``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    fingerprint,
    function_tool,
    hoist_system,
    integer,
    merge_defaults,
    parse_json_object,
    refuse_unknown,
    resolve_tool_choice,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer, url_or_bearer_token
from dressage.proxy.dialects.messages_models import (
    RULES,
    AssistantBlock,
    MessagesRequest,
    TextPart,
    UserBlock,
)
from dressage.proxy.dialects.request_schema import validate_request
from dressage.proxy.errors import OverloadedError, classify, error_message
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import SessionState
from dressage.tito.tool_calls import ParsedAssistant

_HANDLED = frozenset(
    {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p",
     "top_k", "tools", "tool_choice", "thinking", "output_config", "context_management"}
)  # fmt: skip
_IGNORED = frozenset({"metadata", "service_tier"})
_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def _text(content: str | list[TextPart]) -> str:
    """The text of a string or text blocks."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def _user_messages(content: str | list[UserBlock]) -> list[dict[str, object]]:
    """A user turn's blocks as tool messages (``tool_result``) and user messages (text runs), in order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, object]] = []
    text: list[str] = []
    for block in content:
        if block["type"] == "text":
            text.append(block["text"])
            continue
        if text:
            out.append({"role": "user", "content": "".join(text)})
            text = []
        result = block.get("content")
        out.append(
            {
                "role": "tool",
                "tool_call_id": block["tool_use_id"],
                "content": "" if result is None else _text(result),
            }
        )
    if text:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant_message(content: str | list[AssistantBlock]) -> dict[str, object]:
    """An assistant turn's blocks as one message: reasoning, content, tool calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    reasoning, text, calls = [], [], []
    for block in content:
        if block["type"] == "text":
            text.append(block["text"])
        elif block["type"] == "thinking":
            reasoning.append(block["thinking"])
        else:
            fn = {"name": block["name"], "arguments": block["input"]}
            calls.append({"id": block["id"], "type": "function", "function": fn})
    msg: dict[str, object] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _messages(req: MessagesRequest) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for msg in req.messages:
        if msg["role"] == "user":
            out.extend(_user_messages(msg["content"]))
        elif msg["role"] == "assistant":
            out.append(_assistant_message(msg["content"]))
        else:
            out.append({"role": "system", "content": _text(msg["content"])})
    return hoist_system([] if req.system is None else [_text(req.system)], out)


def _tools(req: MessagesRequest) -> list[dict[str, object]] | None:
    if not req.tools:
        return None
    return [
        function_tool(tool["name"], tool.get("description"), tool["input_schema"], f"tools[{i}]")
        for i, tool in enumerate(req.tools)
    ]


def _tool_choice(
    req: MessagesRequest, tools: list[dict[str, object]] | None, ignored: list[str]
) -> tuple[bool, str | None]:
    choice = req.tool_choice
    if choice is None:
        return resolve_tool_choice("auto", None, tools, "tool_choice")
    mode = {"auto": "auto", "none": "none", "any": "required", "tool": "named"}[choice["type"]]
    if "disable_parallel_tool_use" in choice:
        ignored.append("tool_choice.disable_parallel_tool_use")
    return resolve_tool_choice(mode, choice.get("name"), tools, "tool_choice.name")


def _thinking(thinking: dict[str, object] | None, ignored: list[str]) -> bool | None:
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise RequestError(
            "thinking must be {'type': 'enabled' | 'adaptive' | 'disabled'}",
            param="thinking.type",
            code="invalid_value",
        )
    if thinking.get("budget_tokens") is not None:
        integer(thinking, "budget_tokens", 0, 1 << 24)
        ignored.append("thinking.budget_tokens")
    refuse_unknown(thinking, frozenset({"type", "budget_tokens", "display"}), "Anthropic Messages thinking")
    if "display" in thinking:  # Claude Code sends display: omitted; we return the thinking text as generated
        ignored.append("thinking.display")
    return bool(kind != "disabled")


def _output_config(config: dict[str, object] | None, ignored: list[str]) -> None:
    """``output_config``: ``effort`` is recorded as ignored; any other key is refused."""
    if config is None:
        return
    refuse_unknown(config, frozenset({"effort"}), "Anthropic Messages output_config")
    if config.get("effort") not in (None, "low", "medium", "high", "xhigh", "max"):
        raise RequestError(
            "output_config.effort must be 'low', 'medium', 'high', 'xhigh' or 'max'",
            param="output_config.effort",
            code="invalid_value",
        )
    if "effort" in config:
        ignored.append("output_config.effort")


def _context_management(cm: dict[str, object] | None, ignored: list[str]) -> None:
    """``context_management.edits``: ``clear_thinking_*`` recorded as ignored, other edits refused."""
    if cm is None:
        return
    edits = cm.get("edits")
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        raise RequestError(
            "'context_management' must be {'edits': [objects]}",
            param="context_management",
            code="invalid_type",
        )
    for i, edit in enumerate(edits):
        kind = str(edit.get("type", ""))
        if not kind.startswith("clear_thinking_"):
            raise unsupported(
                f"context_management.edits[{i}].type",
                f"context edit {kind!r} is not supported (only clear_thinking_* edits, which the template's "
                "reasoning rendering already covers, are accepted)",
            )
    if edits:
        ignored.append("context_management")


def _sampling(req: MessagesRequest) -> dict[str, object]:
    given = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences or None,
    }
    return {k: v for k, v in given.items() if v is not None}


def _request(raw: bytes, known: frozenset[str], api: str) -> tuple[dict[str, object], MessagesRequest]:
    """The decoded body and its schema; unknown fields refused first, naming them all."""
    body = parse_json_object(raw)
    refuse_unknown(body, known, api)
    return body, validate_request(MessagesRequest, body, RULES)


def parse_messages_request(raw: bytes, default_sampling: Mapping[str, object] | None = None) -> Conversation:
    """Validate a raw Messages body into the shared conversation; :class:`RequestError` for anything wrong."""
    body, req = _request(raw, _HANDLED | _IGNORED, "Anthropic Messages")
    ignored = sorted(k for k in body if k in _IGNORED)
    messages = _messages(req)
    tools = _tools(req)
    parse_tools, force_tool = _tool_choice(req, tools, ignored)
    _output_config(req.output_config, ignored)
    _context_management(req.context_management, ignored)
    if req.max_tokens is None:
        raise RequestError("'max_tokens' is required", param="max_tokens", code="missing_required_parameter")
    sampling = _sampling(req)
    return Conversation(
        dialect="messages",
        messages=messages,
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=bool(req.stream),
        enable_thinking=_thinking(req.thinking, ignored),
        model=req.model,
        max_tokens=merge_defaults(sampling, req.max_tokens, default_sampling),
        sampling=sampling,
        fingerprint=fingerprint("messages", raw),
        include_usage=True,
        ignored=ignored,
    )


def parse_count_tokens_request(raw: bytes) -> Conversation:
    """A ``count_tokens`` body: the conversation part of a Messages request."""
    _, req = _request(raw, _COUNT_FIELDS, "Anthropic count_tokens")
    tools = _tools(req)
    ignored: list[str] = []
    parse_tools, force_tool = _tool_choice(req, tools, ignored)
    return Conversation(
        dialect="messages",
        messages=_messages(req),
        tools=tools,
        parse_tools=parse_tools,
        force_tool=force_tool,
        stream=False,
        enable_thinking=_thinking(req.thinking, ignored),
        model=req.model,
        max_tokens=None,
        sampling={},
        fingerprint=fingerprint("count_tokens", raw),
    )


# --- replies ----------------------------------------------------------------------------------------


def stop_reason(reply: ReplyData, parsed: ParsedAssistant) -> str:
    """``tool_use`` when calls were parsed, ``max_tokens``, ``stop_sequence`` or ``end_turn``."""
    if parsed.tool_calls and reply.stop_reason == "stop":
        return "tool_use"
    if reply.stop_reason == "length":
        return "max_tokens"
    return "stop_sequence" if reply.matched_stop else "end_turn"


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block: a digest of its text (clients keep it, we never need it)."""
    return "dressage-sha256:" + hashlib.sha256(thinking.encode()).hexdigest()


def tool_use_blocks(parsed: ParsedAssistant) -> list[dict[str, object]]:
    """The parsed tool calls as ``tool_use`` blocks (arguments decoded into ``input``)."""
    return [
        {
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"] or "{}"),
        }
        for call in parsed.tool_calls
    ]


def message_body(reply: ReplyData, parsed: ParsedAssistant, model: str) -> dict[str, object]:
    """The ``Message`` object of a recorded turn."""
    content: list[dict[str, object]] = []
    if parsed.reasoning_content:
        thinking = parsed.reasoning_content
        content.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if parsed.content:
        content.append({"type": "text", "text": parsed.content})
    content.extend(tool_use_blocks(parsed))
    return {
        "id": f"msg_{reply.rid or reply.turn_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply, parsed),
        "stop_sequence": reply.matched_stop,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": len(reply.generated_ids)},
    }


def event(name: str, data: dict[str, object]) -> bytes:
    """One ``event:``/``data:`` server-sent event."""
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


def error_object(exc: BaseException, message: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, Anthropic error body) for an exception."""
    status = classify(exc)[0]
    kind = "overloaded_error" if isinstance(exc, OverloadedError) else _ERROR_TYPES.get(status, "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": message}}


class MessagesStream(StreamRenderer):
    """Anthropic's streaming events: one content block at a time, tool calls whole at the end."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.message_id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self.index = -1
        self.open: str | None = None
        self._thinking = ""

    def start(self) -> list[bytes]:
        message: dict[str, object] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [event("message_start", {"message": message}), event("ping", {})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            delta = {"type": "signature_delta", "signature": signature(self._thinking)}
            out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        out.append(event("content_block_stop", {"index": self.index}))
        self.open = None
        return out

    def _open(self, kind: str, block: dict[str, object]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = kind
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        out: list[bytes] = []
        if reasoning:
            if self.open != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._thinking += reasoning
            delta = {"type": "thinking_delta", "thinking": reasoning}
            out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        if content:
            if self.open != "text":
                out += self._open("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": content}
            out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        return out

    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        out = self.delta(reasoning, content, [], [])
        for block in tool_use_blocks(parsed):
            out += self._open("tool_use", {**block, "input": {}})
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"], ensure_ascii=False),
            }
            out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        out += self._close()
        end = {"stop_reason": stop_reason(reply, parsed), "stop_sequence": reply.matched_stop}
        usage = {"output_tokens": len(reply.generated_ids)}
        out.append(event("message_delta", {"delta": end, "usage": usage}))
        out.append(event("message_stop", {}))
        return out

    def error(self, exc: BaseException, message: str) -> list[bytes]:
        _, body = error_object(exc, message)
        return [event("error", {"error": body["error"]})]


class MessagesDialect(Dialect):
    """Anthropic Messages."""

    name = "messages"

    def token(self, request: Request) -> str | None:
        """The URL token, else ``x-api-key``, else the bearer header."""
        if request.path_params.get("token"):
            return url_or_bearer_token(request)
        return request.headers.get("x-api-key") or url_or_bearer_token(request)

    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        return parse_messages_request(raw, default_sampling)

    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, object]:
        return message_body(reply, parsed, self.model_name)

    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        return MessagesStream(f"msg_{rid}", self.model_name, prompt_tokens)

    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        status, body = error_object(exc, error_message(exc, secrets))
        return JSONResponse(body, status_code=status)
