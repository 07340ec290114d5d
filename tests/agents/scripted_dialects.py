"""A scripted model on loopback speaking the agent CLIs' dialects, streaming, for real agent CLIs in
tests (chat completions and the Gemini API also unstreamed).

Like :mod:`tests.agents.scripted_llm` it is not a copy of the proxy: it answers
``/s/<token>/v1/messages`` (Anthropic Messages), ``/s/<token>/v1/responses`` (OpenAI Responses) and
``/s/<token>/v1/chat/completions``, ``/s/<token>/v1beta/models/{model}:(stream)generateContent``
(and the same under ``/v1`` / ``/v1beta`` with the token in the credential header) with server-sent events built from what the test's script
returns for the request, so a CLI's tool loop can be driven deterministically. The script sees the
request's count of tool results and returns either a tool call or a final text. Every request is
kept (dialect, token, credential header, body).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.loopback import ServedInThread, ThreadedServer


@dataclass(frozen=True)
class Reply:
    """What the scripted model says: a tool call (``tool`` + ``arguments``) or ``text``."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    """One request as received."""

    dialect: str
    token: str
    credential: str | None
    body: dict[str, Any]
    tool_results: list[str]


Script = Callable[[Seen], Reply]


def _text_of(content: Any) -> str:
    """Plain text of a content value in any of the three dialects (strings or lists of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(p.get("text") or p.get("content") or p.get("output") or "") for p in content)
    return ""


def tool_results(dialect: str, body: dict[str, Any]) -> list[str]:
    """The tool results the request carries, in order, as text."""
    if dialect == "messages":
        return [
            _text_of(block.get("content"))
            for m in body.get("messages", [])
            if isinstance(m.get("content"), list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        ]
    if dialect == "responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return [_text_of(i.get("output")) for i in items if i.get("type") == "function_call_output"]
    if dialect == "gemini":
        return [
            _text_of(response.get("output") or response.get("error") or json.dumps(response))
            for content in body.get("contents", [])
            for part in content.get("parts", [])
            if isinstance(response := (part.get("functionResponse") or {}).get("response"), dict)
        ]
    return [_text_of(m.get("content")) for m in body.get("messages", []) if m.get("role") == "tool"]


def _sse(events: list[tuple[str | None, dict[str, Any]]], done: bool = False) -> Response:
    out = "".join(
        (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n" for name, data in events
    )
    return Response(out + ("data: [DONE]\n\n" if done else ""), media_type="text/event-stream")


def anthropic_events(model: str, reply: Reply) -> list[tuple[str | None, dict[str, Any]]]:
    """An Anthropic Messages stream for ``reply``."""
    usage = {"input_tokens": 10, "output_tokens": 5}
    start = {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant", "model": model}
    start |= {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    if reply.tool:
        block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": reply.tool, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(reply.arguments)}
        stop = "tool_use"
    else:
        block, delta, stop = (
            {"type": "text", "text": ""},
            {"type": "text_delta", "text": reply.text},
            "end_turn",
        )
    return [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def responses_events(model: str, reply: Reply) -> list[tuple[str | None, dict[str, Any]]]:
    """An OpenAI Responses stream for ``reply``."""
    rid = f"resp_{uuid.uuid4().hex[:12]}"
    base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model}
    if reply.tool:
        args = json.dumps(reply.arguments)
        item = {"type": "function_call", "id": f"fc_{rid}", "call_id": f"call_{rid}", "name": reply.tool}
        item |= {"arguments": args, "status": "completed"}
        body: list[tuple[str | None, dict[str, Any]]] = [
            (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**item, "arguments": "", "status": "in_progress"},
                },
            ),
            (
                "response.function_call_arguments.delta",
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "delta": args,
                },
            ),
            (
                "response.function_call_arguments.done",
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": 0,
                    "arguments": args,
                },
            ),
        ]
    else:
        part = {"type": "output_text", "text": reply.text, "annotations": []}
        item = {
            "type": "message",
            "id": f"msg_{rid}",
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        body = [
            (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {**item, "content": [], "status": "in_progress"},
                },
            ),
            (
                "response.content_part.added",
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "part": {**part, "text": ""},
                },
            ),
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": reply.text,
                },
            ),
        ]
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    usage |= {"input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    done = {**base, "status": "completed", "output": [item], "usage": usage}
    return [
        (
            "response.created",
            {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}},
        ),
        *body,
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]


def chat_events(model: str, reply: Reply) -> list[tuple[str | None, dict[str, Any]]]:
    """A chat-completions stream for ``reply`` (``data:`` lines only)."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    if reply.tool:
        call = {"index": 0, "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function"}
        call["function"] = {"name": reply.tool, "arguments": json.dumps(reply.arguments)}
        delta: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        delta, finish = {"role": "assistant", "content": reply.text}, "stop"
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return [
        (None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        (None, {**base, "choices": [], "usage": usage}),
    ]


def chat_completion(model: str, reply: Reply) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` for ``reply`` (mini-swe-agent, through litellm, never streams)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool:
        call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function"}
        call["function"] = {"name": reply.tool, "arguments": json.dumps(reply.arguments)}
        message["tool_calls"] = [call]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def gemini_response(model: str, reply: Reply) -> dict[str, Any]:
    """A ``GenerateContentResponse`` for ``reply`` (one ``functionCall`` part, or one text part)."""
    part: dict[str, Any] = (
        {"functionCall": {"name": reply.tool, "args": reply.arguments}}
        if reply.tool
        else {"text": reply.text}
    )
    return {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": model,
    }


class ScriptedDialects(ServedInThread):
    """The server; ``port`` for the Unix-socket forwarder, ``requests`` what it received."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Seen] = []
        app = FastAPI()

        def route(
            dialect: str, render: Callable[[str, Reply], list[tuple[str | None, dict[str, Any]]]]
        ) -> Any:
            async def handle(request: Request, token: str = "") -> Response:
                body = await request.json()
                credential = request.headers.get("x-api-key") or request.headers.get("authorization")
                token = token or (credential or "").removeprefix("Bearer ")
                seen = Seen(dialect, token, credential, body, tool_results(dialect, body))
                self.requests.append(seen)
                if not body.get("stream") and dialect == "chat":
                    return JSONResponse(chat_completion(str(body.get("model", "m")), self.script(seen)))
                if not body.get("stream"):
                    return JSONResponse(
                        {"error": {"message": "this scripted model only streams"}}, status_code=400
                    )
                return _sse(render(str(body.get("model", "m")), self.script(seen)), done=dialect == "chat")

            return handle

        async def gemini(request: Request, spec: str, token: str = "") -> Response:
            """``models/{model}:generateContent`` / ``:streamGenerateContent`` (the model, which the
            Gemini API names in the path, is kept in the recorded body as ``model``)."""
            model, _, method = spec.partition(":")
            body = {**(await request.json()), "model": model}
            credential = request.headers.get("x-goog-api-key")
            seen = Seen("gemini", token or credential or "", credential, body, tool_results("gemini", body))
            self.requests.append(seen)
            reply = gemini_response(model, self.script(seen))
            if method == "streamGenerateContent":
                return _sse([(None, reply)])
            return JSONResponse(reply)

        for prefix in ("/s/{token}/v1beta", "/v1beta"):
            app.add_api_route(f"{prefix}/models/{{spec}}", gemini, methods=["POST"])
        for prefix in ("/s/{token}/v1", "/v1"):  # the token in the path, or only in the credential header
            app.add_api_route(f"{prefix}/messages", route("messages", anthropic_events), methods=["POST"])
            app.add_api_route(f"{prefix}/responses", route("responses", responses_events), methods=["POST"])
            app.add_api_route(f"{prefix}/chat/completions", route("chat", chat_events), methods=["POST"])
        self._http = ThreadedServer(app)
        self.port = self._http.port
