"""The OpenAI Responses dialect: ``POST /v1/responses``.

Request -> shared conversation:

- ``instructions`` and every ``system`` / ``developer`` message item become the one leading system
  prompt (:func:`~dressage.proxy.conversation.hoist_system`); ``input`` is a string (one user
  message) or items: messages (``input_text`` / ``output_text`` parts or a string) in roles
  user / assistant / system / developer, ``function_call`` (an assistant tool call: ``call_id`` is
  the call's id, ``arguments`` its JSON), ``function_call_output`` (a tool message),
  ``reasoning`` (the reasoning of the assistant message it precedes: its ``content``
  ``reasoning_text``, else its ``summary`` text, which this proxy writes verbatim). Consecutive
  reasoning / assistant message / function call items form one assistant message, so a reply sent
  back renders exactly as it was generated.
- ``tools``: ``function`` tools; a ``namespace`` tool's nested function tools are flattened (their
  own names; a call of one is answered with its ``namespace``). Hosted tools (``web_search``,
  ``file_search``, ``code_interpreter``, ``image_generation``, ``computer_use_preview``, ``mcp``,
  ``local_shell``) are **dropped and recorded as dropped** on the turn (``info.dropped_tools``):
  Codex always offers ``web_search``, and this proxy runs no hosted tool, so the model never sees
  them. ``custom`` (free-form) tools are refused.
- ``tool_choice`` (``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}``),
  ``reasoning.effort`` (``none`` / ``minimal`` turn thinking off, any other effort on; absent
  leaves the template default), ``reasoning.summary`` (the summary is the reasoning itself),
  ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, ``truncation`` (``disabled`` /
  ``auto``: both mean this proxy's context-window path, an input over the window is refused with
  ``context_length_exceeded`` and the output is capped at the room left; ``auto`` drops no input
  items, since the recorded prompt must be the one the agent sent; echoed in the response).
- ``tool_choice`` required / named with thinking on: the model thinks first, then a grammar forces
  the call (see :mod:`dressage.proxy.recording`), as SGLang and vLLM do.
- Accepted without effect on generation and recorded as ignored: ``parallel_tool_calls``,
  ``prompt_cache_key`` (the engine's prefix cache is automatic), ``metadata``, ``client_metadata``
  (Codex 0.169 sends its turn metadata there), ``user``,
  ``safety_identifier``, ``service_tier``, ``text.verbosity``, ``include`` (only
  ``reasoning.encrypted_content``, answered with the reasoning as base64, and
  ``message.output_text.logprobs``).
- ``store`` (default true, as OpenAI's): the response can be continued with
  ``previous_response_id``. The chain is **served from the durable log**: each stored turn
  records the messages its request added (``info.responses``), so a restarted proxy rebuilds it
  with the session; a response of another session is unknown here. As in OpenAI's API, the
  previous response's ``instructions`` and tools are not carried over.

Replies are ``response`` objects whose ``output`` holds a ``reasoning`` item, a ``message`` item
and ``function_call`` items, or the event stream ``response.created``, ``response.in_progress``,
``response.output_item.added`` / ``.done``, ``response.content_part.added`` / ``.done``,
``response.output_text.delta`` / ``.done``, ``response.reasoning_summary_part.added`` /
``.done``, ``response.reasoning_summary_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done``, then ``response.completed`` (or
``response.incomplete`` at ``max_output_tokens``) with usage; a failure ends with
``response.failed``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    boolean,
    fingerprint,
    function_tool,
    hoist_system,
    integer,
    merge_defaults,
    number,
    parse_json_object,
    refuse_unknown,
    resolve_tool_choice,
    text_of,
    thinking_token_count,
    tool_list,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer
from dressage.proxy.errors import classify, error_response
from dressage.proxy.replies import reply_text, think_open
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import SessionState, response_id
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant, split_think

_HANDLED = frozenset(
    {"model", "input", "instructions", "tools", "tool_choice", "reasoning", "max_output_tokens",
     "temperature", "top_p", "stream", "store", "previous_response_id", "include", "text", "truncation"}
)  # fmt: skip
_IGNORED = frozenset(
    {"parallel_tool_calls", "prompt_cache_key", "metadata", "client_metadata", "user", "safety_identifier",
     "service_tier"}
)  # fmt: skip
_HOSTED = frozenset(
    {"web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
     "computer_use_preview", "mcp", "local_shell"}
)  # fmt: skip
_INCLUDE = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})


class _Items:
    """Builds messages from input items, merging one assistant turn's items into one message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, object]] = []
        self._assistant: dict[str, object] | None = None

    def assistant(self) -> dict[str, Any]:
        if self._assistant is None:
            self._assistant = {"role": "assistant", "content": ""}
            self.messages.append(self._assistant)
        return self._assistant

    def other(self, msg: dict[str, object]) -> None:
        self._assistant = None
        self.messages.append(msg)


def _content_text(content: object, where: str) -> str:
    if isinstance(content, list):
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text"):
                raise unsupported(
                    f"{where}[{i}]", f"content part {kind!r} is not supported (text models only)"
                )
    return text_of(content, where)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """The reasoning of a ``reasoning`` item: its text content, our encrypted form, or its summary."""
    content = item.get("content")
    if content:
        return text_of(content, f"{where}.content")
    encrypted = item.get("encrypted_content")
    if encrypted:
        try:
            return base64.b64decode(encrypted, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise RequestError(
                f"{where}.encrypted_content was not written by this proxy",
                param=f"{where}.encrypted_content",
                code="invalid_value",
            ) from e
    return text_of(item.get("summary") or [], f"{where}.summary")


def _add_item(items: _Items, item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise RequestError(f"{where} must be an object", param=where, code="invalid_type")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        text = _content_text(item.get("content"), f"{where}.content")
        if role == "assistant":
            msg = items.assistant()
            msg["content"] += text
        elif role in ("user", "system", "developer"):
            items.other({"role": role, "content": text})
        else:
            raise RequestError(
                f"{where}.role must be user, assistant, system or developer, got {role!r}",
                param=f"{where}.role", code="invalid_value",
            )  # fmt: skip
    elif kind == "function_call":
        call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
            raise RequestError(
                f"{where} must have string call_id, name and arguments", param=where, code="invalid_value"
            )
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        items.assistant().setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise RequestError(
                f"{where}.call_id must be a string", param=f"{where}.call_id", code="invalid_value"
            )
        items.other(
            {"role": "tool", "tool_call_id": call_id, "content": _content_text(output, f"{where}.output")}
        )
    elif kind == "reasoning":
        msg = items.assistant()
        msg["reasoning_content"] = msg.get("reasoning_content", "") + _reasoning_text(item, where)
    else:
        raise unsupported(where, f"input item type {kind!r} is not supported")


def _input_messages(body: dict[str, object]) -> list[dict[str, object]]:
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestError(
            "'input' must be a string or an array of items", param="input", code="invalid_type"
        )
    items = _Items()
    for i, item in enumerate(value):
        _add_item(items, item, f"input[{i}]")
    return items.messages


def _tools(body: dict[str, object], info: dict[str, object]) -> list[dict[str, Any]] | None:
    tools = tool_list(body.get("tools"))
    if tools is None:
        return None
    out: list[dict[str, object]] = []
    dropped: list[str] = []
    namespaces: dict[str, str] = {}
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            out.append(
                function_tool(
                    tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]"
                )
            )
        elif kind == "namespace":
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise RequestError(
                    f"tools[{i}].tools must be an array", param=f"tools[{i}].tools", code="invalid_type"
                )
            for j, fn in enumerate(inner):
                where = f"tools[{i}].tools[{j}]"
                if not isinstance(fn, dict) or fn.get("type", "function") != "function":
                    raise unsupported(where, "a namespace may hold only function tools here")
                out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), where))
                namespaces[fn["name"]] = str(tool.get("name"))
        elif kind in _HOSTED:
            dropped.append(str(kind))
        else:
            raise unsupported(f"tools[{i}]", f"tool type {kind!r} is not supported")
    if dropped:
        info["dropped_tools"] = dropped
    if namespaces:
        info["namespaces"] = namespaces
    return out or None


def _tool_choice(body: dict[str, object], tools: list[dict[str, object]] | None) -> tuple[bool, str | None]:
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none", "required"):
        return resolve_tool_choice(choice or "auto", None, tools, "tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        return resolve_tool_choice("named", choice.get("name"), tools, "tool_choice.name")
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
        code="invalid_value",
    )


def _thinking(body: dict[str, object]) -> bool | None:
    reasoning = body.get("reasoning")
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise RequestError("'reasoning' must be an object", param="reasoning", code="invalid_type")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise RequestError(
            f"reasoning.effort {effort!r} is not known", param="reasoning.effort", code="invalid_value"
        )
    return effort not in ("none", "minimal")


def _check_text_and_include(body: dict[str, object], ignored: list[str]) -> set[str]:
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise unsupported("text.format", "structured output formats are not supported")
        if isinstance(text, dict) and "verbosity" in text:
            ignored.append("text.verbosity")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise RequestError("'include' must be an array of strings", param="include", code="invalid_type")
    unknown = sorted(set(include) - _INCLUDE)
    if unknown:
        raise unsupported("include", f"include {', '.join(unknown)} is not supported")
    return set(include)


def _truncation(body: dict[str, object], info: dict[str, object]) -> None:
    """``truncation`` ``disabled`` / ``auto``, recorded on the turn (``info.truncation``) when given.

    Both are served by the context-window path: an input over the window is refused with
    ``context_length_exceeded`` (and a ``context_overflow`` event), and the generation is capped
    at the room left (``status`` ``incomplete``). ``auto`` does not drop input items: the proxy
    never rewrites the prompt an agent sent, since the recorded tokens must be what it saw.
    """
    value = body.get("truncation")
    if value is None:
        return
    if value not in ("disabled", "auto"):
        raise RequestError(
            "'truncation' must be 'disabled' or 'auto'", param="truncation", code="invalid_value"
        )
    info["truncation"] = value


def _sampling(body: dict[str, object]) -> dict[str, object]:
    sampling: dict[str, object] = {}
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = number(body, name, lo, hi)
        if value is not None:
            sampling[name] = value
    return sampling


def _store(body: dict[str, object]) -> bool:
    return True if body.get("store") is None else boolean(body, "store")


class ResponsesDialect(Dialect):
    """OpenAI Responses."""

    name = "responses"

    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        body = parse_json_object(raw)
        refuse_unknown(body, _HANDLED | _IGNORED, "OpenAI Responses")
        ignored = sorted(k for k in body if k in _IGNORED)
        include = _check_text_and_include(body, ignored)
        info: dict[str, object] = {}
        previous = body.get("previous_response_id")
        history = self.history(state, previous) if previous is not None else []
        new = _input_messages(body)
        instructions = body.get("instructions")
        system = [] if instructions is None else [text_of(instructions, "instructions")]
        tools = _tools(body, info)
        parse_tools, force_tool = _tool_choice(body, tools)
        thinking = _thinking(body)
        if _store(body):
            info["responses"] = {
                "previous": previous, "input": new, "parse_tools": parse_tools, "enable_thinking": thinking
            }  # fmt: skip
        info["include"] = sorted(include)
        _truncation(body, info)
        sampling = _sampling(body)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError("'model' must be a string", param="model", code="invalid_type")
        return Conversation(
            dialect="responses",
            messages=hoist_system(system, history + new),
            tools=tools,
            parse_tools=parse_tools,
            force_tool=force_tool,
            stream=boolean(body, "stream"),
            enable_thinking=thinking,
            model=model,
            max_tokens=merge_defaults(
                sampling, integer(body, "max_output_tokens", 1, 1 << 24), default_sampling
            ),
            sampling=sampling,
            fingerprint=fingerprint("responses", raw),
            logprobs="message.output_text.logprobs" in include,
            include_usage=True,
            ignored=ignored,
            info=info,
        )

    def history(self, state: SessionState, previous: object) -> list[dict[str, object]]:
        """The messages of a stored response chain, oldest first, each reply as it was given."""
        if not isinstance(previous, str):
            raise RequestError(
                "'previous_response_id' must be a string", param="previous_response_id", code="invalid_type"
            )
        chain = []
        cursor: str | None = previous
        while cursor is not None:
            link = state.responses.get(cursor)
            if link is None:
                raise RequestError(
                    f"previous response {cursor!r} is not a stored response of this session",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            chain.append(link)
            cursor = link.previous
        messages: list[dict[str, object]] = []
        for link in reversed(chain):
            reply = state.replies[link.turn_index]
            text = reply_text(self.profile, reply.forced_ids, reply.generated_ids, reply.matched_stop)
            parsed = self._parse(text, link.parse_tools, link.enable_thinking, reply.turn_id)
            messages += [*link.input, parsed.to_message()]
        return messages

    def _parse(self, text: str, parse_tools: bool, thinking: bool | None, seed: str) -> ParsedAssistant:
        if parse_tools:
            return self.profile.parse_assistant(text, tools=None, enable_thinking=thinking, seed=seed)
        think = thinking if thinking is not None else bool(getattr(self.profile, "thinking", False))
        reasoning, rest = split_think(text, think)
        return ParsedAssistant(content=rest, reasoning_content=reasoning)

    def respond(self, conv: Conversation, reply: ReplyData, parsed: ParsedAssistant) -> dict[str, object]:
        items = output_items(conv, reply.rid, parsed)
        return response_object(self.profile, conv, reply.rid, reply.created, self.model_name, items, reply)

    def renderer(self, conv: Conversation, rid: str, created: int, prompt_tokens: int) -> StreamRenderer:
        return ResponsesStream(self.profile, conv, rid, created, self.model_name)

    def error_response(self, exc: BaseException, secrets: Iterable[str]) -> JSONResponse:
        return error_response(exc, secrets)


# --- replies ----------------------------------------------------------------------------------------


def reasoning_item(conv: Conversation, rid: str, text: str) -> dict[str, object]:
    """The ``reasoning`` output item (summary = the reasoning itself)."""
    item: dict[str, object] = {
        "type": "reasoning",
        "id": f"rs_{rid}",
        "summary": [{"type": "summary_text", "text": text}],
    }
    if "reasoning.encrypted_content" in conv.info.get("include", ()):
        item["encrypted_content"] = base64.b64encode(text.encode()).decode()
    return item


def message_item(rid: str, text: str, status: str = "completed") -> dict[str, object]:
    """The assistant ``message`` output item."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": f"msg_{rid}",
        "role": "assistant",
        "status": status,
        "content": [part] if status == "completed" else [],
    }


def call_items(conv: Conversation, parsed: ParsedAssistant) -> list[dict[str, object]]:
    """The ``function_call`` output items (with their ``namespace`` when a namespace tool was called)."""
    namespaces = conv.info.get("namespaces", {})
    out = []
    for call in parsed.tool_calls:
        fn = call["function"]
        item = {
            "type": "function_call",
            "id": f"fc_{call['id']}",
            "call_id": call["id"],
            "name": fn["name"],
            "arguments": fn["arguments"],
            "status": "completed",
        }
        if fn["name"] in namespaces:
            item["namespace"] = namespaces[fn["name"]]
        out.append(item)
    return out


def output_items(conv: Conversation, rid: str, parsed: ParsedAssistant) -> list[dict[str, object]]:
    """Every output item of a reply, in order: reasoning, message, function calls."""
    items = []
    if parsed.reasoning_content:
        items.append(reasoning_item(conv, rid, parsed.reasoning_content))
    if parsed.content:
        items.append(message_item(rid, parsed.content))
    return items + call_items(conv, parsed)


def _choice_name(conv: Conversation) -> str:
    if not conv.parse_tools:
        return "none"
    return "auto" if conv.force_tool is None else "required"


def response_object(
    profile: ModelProfile,
    conv: Conversation,
    rid: str,
    created: int,
    model: str,
    output: list[dict[str, object]],
    reply: ReplyData | None,
) -> dict[str, object]:
    """The ``response`` object (``reply`` None: still in progress)."""
    status = (
        "in_progress" if reply is None else ("incomplete" if reply.stop_reason == "length" else "completed")
    )
    body: dict[str, object] = {
        "id": response_id(rid),
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "previous_response_id": (conv.info.get("responses") or {}).get("previous"),
        "store": "responses" in conv.info,
        "tool_choice": _choice_name(conv),
        "tools": [{"type": "function", **t["function"]} for t in conv.tools or ()],
        "max_output_tokens": conv.max_tokens,
        "truncation": conv.info.get("truncation", "disabled"),
        "usage": None,
    }
    if reply is not None:
        think_end = profile.tokenizer.encode("</think>")
        n_out = len(reply.generated_ids)
        body["usage"] = {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {
                "reasoning_tokens": thinking_token_count(
                    reply.generated_ids,
                    think_end[0] if len(think_end) == 1 else None,
                    think_open(profile, conv),
                )
            },
            "total_tokens": reply.prompt_tokens + n_out,
        }
    return body


class ResponsesStream(StreamRenderer):
    """The Responses event stream: items opened and closed in order, ``response.completed`` last."""

    def __init__(self, profile: ModelProfile, conv: Conversation, rid: str, created: int, model: str) -> None:
        self.profile, self.conv, self.rid, self.created, self.model = profile, conv, rid, created, model
        self.seq = 0
        self.items: list[dict[str, object]] = []
        self.open: str | None = None
        self.text = ""

    def _event(self, kind: str, **data: object) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def _response(self, reply: ReplyData | None) -> dict[str, object]:
        return response_object(self.profile, self.conv, self.rid, self.created, self.model, self.items, reply)

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=self._response(None)),
            self._event("response.in_progress", response=self._response(None)),
        ]

    def _close(self) -> list[bytes]:
        index, out = len(self.items), []
        part: dict[str, object]
        if self.open == "reasoning":
            rs = f"rs_{self.rid}"
            part = {"type": "summary_text", "text": self.text}
            out += [
                self._event("response.reasoning_summary_text.done", item_id=rs, output_index=index, summary_index=0, text=self.text),
                self._event("response.reasoning_summary_part.done", item_id=rs, output_index=index, summary_index=0, part=part),
            ]  # fmt: skip
            item = reasoning_item(self.conv, self.rid, self.text)
        elif self.open == "message":
            msg = f"msg_{self.rid}"
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            out += [
                self._event("response.output_text.done", item_id=msg, output_index=index, content_index=0, text=self.text, logprobs=[]),
                self._event("response.content_part.done", item_id=msg, output_index=index, content_index=0, part=part),
            ]  # fmt: skip
            item = message_item(self.rid, self.text)
        else:
            return []
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.items.append(item)
        self.open, self.text = None, ""
        return out

    def _open(self, kind: str) -> list[bytes]:
        out = self._close()
        index = len(self.items)
        self.open = kind
        if kind == "reasoning":
            rs = f"rs_{self.rid}"
            out += [
                self._event("response.output_item.added", output_index=index, item={"type": "reasoning", "id": rs, "summary": []}),
                self._event("response.reasoning_summary_part.added", item_id=rs, output_index=index, summary_index=0,
                            part={"type": "summary_text", "text": ""}),
            ]  # fmt: skip
        else:
            msg = f"msg_{self.rid}"
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += [
                self._event("response.output_item.added", output_index=index, item=message_item(self.rid, "", "in_progress")),
                self._event("response.content_part.added", item_id=msg, output_index=index, content_index=0, part=part),
            ]  # fmt: skip
        return out

    def delta(self, reasoning: str, content: str, ids: list[int], logprobs: list[float]) -> list[bytes]:
        out: list[bytes] = []
        index = len(self.items)
        if reasoning:
            if self.open != "reasoning":
                out += self._open("reasoning")
                index = len(self.items)
            self.text += reasoning
            out.append(
                self._event("response.reasoning_summary_text.delta", item_id=f"rs_{self.rid}", output_index=index,
                            summary_index=0, delta=reasoning)
            )  # fmt: skip
        if content:
            if self.open != "message":
                out += self._open("message")
                index = len(self.items)
            self.text += content
            out.append(
                self._event("response.output_text.delta", item_id=f"msg_{self.rid}", output_index=index,
                            content_index=0, delta=content, logprobs=[])
            )  # fmt: skip
        return out

    def finish(self, reply: ReplyData, parsed: ParsedAssistant, reasoning: str, content: str) -> list[bytes]:
        out = self.delta(reasoning, content, [], [])
        out += self._close()
        for item in call_items(self.conv, parsed):
            index = len(self.items)
            out += [
                self._event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"]),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item),
            ]  # fmt: skip
            self.items.append(item)
        response = self._response(reply)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=response))
        return out

    def error(self, exc: BaseException, message: str) -> list[bytes]:
        _, _, param, code = classify(exc)
        response = {**self._response(None), "status": "failed", "error": {"code": code, "message": message}}
        return [
            self._event("error", code=code, message=message, param=param),
            self._event("response.failed", response=response),
        ]
