"""A scripted engine speaking SGLang's ``/generate`` protocol, so real agents can finish a tool loop
through the real TITO proxy (a tiny random model would never write a well-formed tool call).

It stands in for SGLang, not for any Dressage component: the proxy renders the conversation with the
official Qwen3.5 template, sends token ids here, and records whatever ids come back. The engine decodes
the prompt with the same Qwen3.5 tokenizer, and writes, in Qwen3.5's tool-call format:

- while the prompt holds no ``<tool_response>`` and offers the scripted tool: a call of that tool;
- once a tool response is in the prompt: ``final answer: <last line of the last response>``;
- otherwise (a side request without tools): ``side request``.

A prompt ending in an open ``<think>`` gets a short reasoning block first. Every request's
``input_ids`` and returned ``output_ids`` are kept in ``calls``, so tests can compare them with the
turns the proxy recorded (token-exact means equal, id for id).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dressage.tito.tokenizer import load_qwen35_tokenizer
from tests.loopback import ThreadedServer

IM_END = "<|im_end|>"
MAX_CONTEXT = 262_144


@dataclass(frozen=True)
class EngineCall:
    """One ``/generate`` request: the prompt it got and the ids it answered."""

    input_ids: list[int]
    output_ids: list[int]
    prompt_text: str


def tool_call_text(name: str, arguments: dict[str, str]) -> str:
    """A Qwen3.5 tool call block."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


class ScriptedEngine:
    """The server; ``url`` is what ``engine: {kind: sglang, urls: [...]}`` takes."""

    def __init__(self, tool: str, arguments: dict[str, str]) -> None:
        self.tool = tool
        self.arguments = arguments
        self.calls: list[EngineCall] = []
        self.tokenizer = load_qwen35_tokenizer()
        app = FastAPI()
        app.add_api_route("/generate", self._generate, methods=["POST"])
        app.add_api_route("/model_info", self._model_info, methods=["GET"])
        app.add_api_route("/health", lambda: Response(status_code=200), methods=["GET"])
        self._http = ThreadedServer(app)
        self.url = self._http.base

    def reply_text(self, prompt: str) -> str:
        """What the scripted model writes after ``prompt`` (see the module docstring)."""
        responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt, re.DOTALL)
        if responses:
            lines = responses[-1].strip().splitlines() or [""]
            body = f"final answer: {lines[-1].strip()}"
        elif f'"name": "{self.tool}"' in prompt:
            body = tool_call_text(self.tool, self.arguments)
        else:
            body = "side request"
        thinking = "The task needs one command.\n</think>\n\n" if prompt.endswith("<think>\n") else ""
        return thinking + body + IM_END

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        input_ids = list(body["input_ids"])
        prompt = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        output_ids = list(self.tokenizer.encode(self.reply_text(prompt), add_special_tokens=False).ids)
        limit = int(body.get("sampling_params", {}).get("max_new_tokens") or len(output_ids))
        finish: dict[str, Any] = {"type": "stop", "matched": output_ids[-1]}
        if len(output_ids) > limit:
            output_ids, finish = output_ids[:limit], {"type": "length", "length": limit}
        self.calls.append(EngineCall(input_ids, output_ids, prompt))
        meta: dict[str, Any] = {
            "id": body.get("rid") or "scripted",
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
            "weight_version": "0",
            "weight_versions": [{"version": "0", "start": 0, "end": len(output_ids)}],
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.5, t, None] for t in output_ids]
        chunk = {
            "text": self.tokenizer.decode(output_ids, skip_special_tokens=True),
            "output_ids": output_ids,
            "meta_info": meta,
        }
        if body.get("stream"):
            return Response(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", media_type="text/event-stream")
        return JSONResponse(chunk)

    async def _model_info(self) -> dict[str, Any]:
        return {
            "model_path": "scripted-qwen3.5",
            "is_generation": True,
            "weight_version": "0",
            "max_context": MAX_CONTEXT,
        }

    @contextmanager
    def running(self) -> Iterator[ScriptedEngine]:
        """Serve in a thread for the duration of the block."""
        self._http.start()
        try:
            yield self
        finally:
            self._http.stop()
