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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from starlette.responses import JSONResponse

from dressage.errors import RequestError
from dressage.proxy.conversation import (
    Conversation,
    fingerprint,
    function_tool,
    hoist_system,
    merge_defaults,
    parse_json_object,
    refuse_unknown,
    resolve_tool_choice,
    text_of,
    thinking_token_count,
    unsupported,
)
from dressage.proxy.dialects.base import Dialect, StreamRenderer
from dressage.proxy.dialects.request_schema import validate_request
from dressage.proxy.dialects.responses_models import (
    RULES,
    ContentPart,
    Item,
    MessageItem,
    NamespaceTool,
    ResponsesRequest,
    TextPart,
)
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


def _text(content: str | Sequence[ContentPart | TextPart]) -> str:
    """The text of a string or text parts."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def _reasoning_text(item: Mapping[str, object], where: str) -> str:
    """The reasoning of a ``reasoning`` item: its text content, our encrypted form, or its summary."""
    content = item.get("content")
    if content:
        return text_of(content, f"{where}.content")
    encrypted = item.get("encrypted_content")
    if encrypted:
        try:
            return base64.b64decode(str(encrypted), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise RequestError(
                f"{where}.encrypted_content was not written by this proxy",
                param=f"{where}.encrypted_content",
                code="invalid_value",
            ) from e
    return text_of(item.get("summary") or [], f"{where}.summary")


def _input_messages(value: str | list[Item]) -> list[dict[str, object]]:
    """The input items as messages: one assistant turn's reasoning, text and calls merged into one."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    items = _Items()
    for i, item in enumerate(value):
        if item.get("type", "message") == "message":
            message = cast(MessageItem, item)
            if message["role"] == "assistant":
                items.assistant()["content"] += _text(message["content"])
            else:
                items.other({"role": message["role"], "content": _text(message["content"])})
        elif item["type"] == "function_call":
            fn = {"name": item["name"], "arguments": item["arguments"]}
            items.assistant().setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": fn}
            )
        elif item["type"] == "function_call_output":
            items.other({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
        else:
            msg = items.assistant()
            msg["reasoning_content"] = msg.get("reasoning_content", "") + _reasoning_text(item, f"input[{i}]")
    return items.messages


def _tools(req: ResponsesRequest, info: dict[str, object]) -> list[dict[str, object]] | None:
    """Function tools, a namespace's functions flattened (recorded in ``info``); hosted tools dropped and recorded."""
    out: list[dict[str, object]] = []
    dropped: list[str] = []
    namespaces: dict[str, str] = {}
    for i, tool in enumerate(req.tools or ()):
        if tool["type"] == "function":
            out.append(
                function_tool(
                    tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]"
                )
            )
        elif tool["type"] == "namespace":
            for j, fn in enumerate(cast(NamespaceTool, tool)["tools"]):
                where = f"tools[{i}].tools[{j}]"
                out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), where))
                namespaces[str(fn["name"])] = str(tool.get("name"))
        else:
            dropped.append(tool["type"])
    if dropped:
        info["dropped_tools"] = dropped
    if namespaces:
        info["namespaces"] = namespaces
    return out or None


def _tool_choice(req: ResponsesRequest, tools: list[dict[str, object]] | None) -> tuple[bool, str | None]:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return resolve_tool_choice(choice or "auto", None, tools, "tool_choice")
    return resolve_tool_choice("named", choice.get("name"), tools, "tool_choice.name")


def _thinking(req: ResponsesRequest) -> bool | None:
    effort = req.reasoning.get("effort") if req.reasoning is not None else None
    return None if effort is None else effort not in ("none", "minimal")


def _check_text_and_include(req: ResponsesRequest, ignored: list[str]) -> set[str]:
    text = req.text
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise unsupported("text.format", "structured output formats are not supported")
        if isinstance(text, dict) and "verbosity" in text:
            ignored.append("text.verbosity")
    include = req.include or []
    unknown = sorted(set(include) - _INCLUDE)
    if unknown:
        raise unsupported("include", f"include {', '.join(unknown)} is not supported")
    return set(include)


def _sampling(req: ResponsesRequest) -> dict[str, object]:
    given = {"temperature": req.temperature, "top_p": req.top_p}
    return {k: v for k, v in given.items() if v is not None}


class ResponsesDialect(Dialect):
    """OpenAI Responses."""

    name = "responses"

    def parse(
        self, raw: bytes, state: SessionState, default_sampling: Mapping[str, object] | None
    ) -> Conversation:
        body = parse_json_object(raw)
        refuse_unknown(body, _HANDLED | _IGNORED, "OpenAI Responses")
        req = validate_request(ResponsesRequest, body, RULES)
        ignored = sorted(k for k in body if k in _IGNORED)
        include = _check_text_and_include(req, ignored)
        info: dict[str, object] = {}
        previous = req.previous_response_id
        history = self.history(state, previous) if previous is not None else []
        new = _input_messages(req.input)
        system = [] if req.instructions is None else [_text(req.instructions)]
        tools = _tools(req, info)
        parse_tools, force_tool = _tool_choice(req, tools)
        thinking = _thinking(req)
        if req.store is not False:  # OpenAI's default: stored
            info["responses"] = {
                "previous": previous, "input": new, "parse_tools": parse_tools, "enable_thinking": thinking
            }  # fmt: skip
        info["include"] = sorted(include)
        if req.truncation is not None:
            # ``disabled`` and ``auto`` are both served by the context-window path: an input over the
            # window is refused (``context_length_exceeded``), the generation capped at the room left;
            # ``auto`` drops no input item, since the recorded tokens must be what the agent sent.
            info["truncation"] = req.truncation
        sampling = _sampling(req)
        return Conversation(
            dialect="responses",
            messages=hoist_system(system, history + new),
            tools=tools,
            parse_tools=parse_tools,
            force_tool=force_tool,
            stream=bool(req.stream),
            enable_thinking=thinking,
            model=req.model,
            max_tokens=merge_defaults(sampling, req.max_output_tokens, default_sampling),
            sampling=sampling,
            fingerprint=fingerprint("responses", raw),
            logprobs="message.output_text.logprobs" in include,
            include_usage=True,
            ignored=ignored,
            info=info,
        )

    def history(self, state: SessionState, previous: str) -> list[dict[str, object]]:
        """The messages of a stored response chain, oldest first, each reply as it was given."""
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
