"""A scripted inference engine on loopback: SGLang's ``/generate`` protocol, replies chosen by a test.

The proxy talks to it exactly as to SGLang or the dev engine (token ids in, token ids out, cumulative
streaming, ``/model_info``, ``/abort_request``). What it generates is a function of the request:
``script(prompt_text, n_requests_so_far, sampling_params)`` (the request's own sampling params, e.g.
its ``sampling_seed``) returns the assistant text (e.g. a Qwen3.5 XML tool call), which is tokenized
with the profile's own vocabulary and ended with ``<|im_end|>``, each token with a deterministic
logprob. So agent tests (whitebox, or real CLIs speaking any dialect) can run real
multi-step tool loops through the proxy and check what was recorded token by token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dressage.tito import get_profile
from tests.loopback import ServedInThread, ThreadedServer

Script = Callable[[str, int, Mapping[str, Any]], str]
"""(prompt text, number of earlier requests, the request's own sampling params as the proxy sent them,
e.g. ``sampling_seed``) -> the assistant text to generate."""


COUNT_TOOL = {
    "type": "function",
    "function": {
        "name": "count",
        "description": "Count one further.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}
"""The tool the scripted multi-turn agents call (``qwen_tool_call("count", n=...)`` answers it)."""


def qwen_tool_call(name: str, **params: Any) -> str:
    """A Qwen3.5 XML tool call as the model writes it."""
    body = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in params.items()
    )
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def logprob_of(token_id: int) -> float:
    """The logprob the scripted engine reports for a token (deterministic, distinct per id)."""
    return -((token_id % 97) + 1) / 100.0


class ScriptedEngine(ServedInThread):
    """The server; ``url`` is its base URL; ``prompts`` keeps each request's prompt text."""

    def __init__(
        self,
        script: Script,
        profile: str = "qwen3.5",
        max_context: int = 32768,
        break_after: int | None = None,
    ) -> None:
        self.script = script
        self.break_after = break_after
        """Streamed replies end abruptly (no finish reason) after this many tokens: a failing engine."""
        self.profile = get_profile(profile)
        self.prompts: list[str] = []
        self.sampling: list[dict[str, Any]] = []
        """Each request's sampling params as the proxy sent them (e.g. ``sampling_seed``), in order."""
        self.max_context = max_context
        self.weight_version = "0"
        """The policy version the engine reports for what it generates (a test may move it on)."""
        app = FastAPI()
        app.add_api_route("/generate", self._generate, methods=["POST"])
        app.add_api_route("/model_info", self._model_info, methods=["GET"])
        app.add_api_route("/get_model_info", self._model_info, methods=["GET"])
        app.add_api_route("/abort_request", self._abort, methods=["POST"])
        app.add_api_route("/health", self._health, methods=["GET"])
        self._http = ThreadedServer(app)
        self.url = self._http.base

    def _reply_ids(self, prompt: str, max_new: int, sampling: Mapping[str, Any]) -> tuple[list[int], str]:
        text = self.script(prompt, len(self.prompts), sampling)
        self.prompts.append(prompt)
        ids = [*self.profile.tokenizer.encode(text), self.profile.turn_end_id]
        if len(ids) > max_new:
            return ids[:max_new], "length"
        return ids, "stop"

    def _chunk(self, rid: str, prompt_len: int, ids: list[int], finish: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "output_token_logprobs": [[logprob_of(t), t, None] for t in ids],
            "finish_reason": None,
        }
        if finish is not None:
            meta["finish_reason"] = {
                "type": finish,
                "matched": self.profile.turn_end_id if finish == "stop" else None,
            }
            if finish == "length":
                meta["finish_reason"]["length"] = len(ids)
            meta["weight_versions"] = [{"version": self.weight_version, "start": 0, "end": len(ids)}]
        return {"text": self.profile.tokenizer.decode(ids), "output_ids": ids, "meta_info": meta}

    async def _generate(self, request: Request) -> Response:
        body = await request.json()
        input_ids = body["input_ids"]
        sampling = dict(body.get("sampling_params") or {})
        self.sampling.append(sampling)
        prompt = self.profile.tokenizer.decode(input_ids)
        ids, finish = self._reply_ids(prompt, int(sampling.get("max_new_tokens") or 1 << 20), sampling)
        rid = body.get("rid") or "scripted"
        if not body.get("stream"):
            return JSONResponse(self._chunk(rid, len(input_ids), ids, finish))

        def events() -> Iterator[bytes]:
            if self.break_after is not None:
                yield f"data: {json.dumps(self._chunk(rid, len(input_ids), ids[: self.break_after], None))}\n\n".encode()
                return
            for n in range(1, len(ids) + 1, 4):
                yield f"data: {json.dumps(self._chunk(rid, len(input_ids), ids[:n], None))}\n\n".encode()
            yield f"data: {json.dumps(self._chunk(rid, len(input_ids), ids, finish))}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _model_info(self) -> dict[str, Any]:
        return {
            "model_path": "scripted",
            "is_generation": True,
            "weight_version": self.weight_version,
            "max_context": self.max_context,
        }

    async def _abort(self) -> dict[str, Any]:
        return {}

    async def _health(self) -> Response:
        return Response(status_code=200)
