"""A scripted OpenAI-compatible chat server on loopback, standing in for a model in agent tests.

It is not a copy of the proxy: it answers ``POST /v1/chat/completions`` (and ``/s/<token>/v1/...``)
with whatever the test's ``script`` returns for the request body, so agent loops can be driven
deterministically (tool calls, garbage, endless tool calls). Every request body is kept in
``requests`` together with its Authorization header.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.loopback import ServedInThread, ThreadedServer

Script = Callable[[dict[str, Any]], dict[str, Any]]
"""Request body -> assistant message ``{"content": ..., "tool_calls": [...]}``."""


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI tool call entry."""
    return {
        "id": f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ScriptedLLM(ServedInThread):
    """The server; ``url`` is its OpenAI base URL (``.../v1``)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        app = FastAPI()

        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            self.auth.append(request.headers.get("authorization"))
            msg = {"role": "assistant", "content": None, **self.script(body)}
            finish = "tool_calls" if msg.get("tool_calls") else "stop"
            return JSONResponse(
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
        app.add_api_route("/s/{token}/v1/chat/completions", chat, methods=["POST"])
        self._http = ThreadedServer(app)
        self.port = self._http.port
        self.base = self._http.base
        self.url = f"{self.base}/v1"
