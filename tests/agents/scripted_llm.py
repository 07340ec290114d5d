"""A scripted OpenAI-compatible chat server on loopback, standing in for a model in agent tests.

It is not a copy of the proxy: it answers ``POST /v1/chat/completions`` (and ``/s/<token>/v1/...``)
with whatever the test's ``script`` returns for the request body, so agent loops can be driven
deterministically (tool calls, garbage, endless tool calls). Every request body is kept in
``requests`` together with its Authorization header.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

Script = Callable[[dict[str, Any]], dict[str, Any]]
"""Request body -> assistant message ``{"content": ..., "tool_calls": [...]}``."""


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI tool call entry."""
    return {
        "id": f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ScriptedLLM:
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
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/v1"
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )

    @contextmanager
    def running(self) -> Iterator[ScriptedLLM]:
        """Serve in a thread for the duration of the block."""
        thread = threading.Thread(target=self._server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(self.base + "/docs", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        try:
            yield self
        finally:
            self._server.should_exit = True
            thread.join(timeout=5)
