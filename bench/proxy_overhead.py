"""Latency the TITO proxy adds per turn, as a client sees it, for every dialect, on SQLite and PostgreSQL.

A 100-turn tool loop (one tool call per turn, ~300-token tool results) grows the conversation
to about 30k tokens, against an engine that answers instantly: a minimal SGLang-protocol server
written here (a benchmark harness, not a test double) that returns a fixed tool call with
logprobs. Each dialect (chat completions, Anthropic Messages, OpenAI Responses) runs the loop in
its own wire format, streaming and not. Per turn the client measures send-to-last-byte through
the proxy, then a direct engine call with a prompt of the same length (the baseline measured in
the same run); the difference is what the proxy adds: parse, auth, render + incremental
tokenization, the durable append, the reply. Printed per (backend, dialect, stream):

* added latency p50/p99 over warm turns (after 5 warm-up turns), and the cold first turn;
* the ratio of turn-100 to turn-1 cost (mean added latency of the last 5 over turns 6-10;
  target <= 1.5);
* the server-side overhead (``x-dressage-overhead-ms``) p50 for reference.

Target: p50 added <= 3 ms with PostgreSQL, for every dialect. Run:
``python bench/proxy_overhead.py [--turns 100] [--dialects chat,messages,responses]``.
PostgreSQL comes from ``DRESSAGE_TEST_PG_ADMIN_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
the backend is skipped when unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from bench_db import fresh_database

from dressage.config import Settings
from dressage.proxy import ProxyServer
from dressage.store import EventStore
from dressage.store.db import upgrade
from dressage.tito import get_profile

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
CALL_TEXT = "<tool_call>\n<function=read_file>\n<parameter=path>\n/src/main.py\n</parameter>\n</function>\n</tool_call>"
CALL_TEXTS = {  # ``--profile``: the engine's fixed reply in each family's form (one read_file call)
    "qwen": CALL_TEXT,
    "deepseek": "Read it.</think><\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function"
    '<\uff5ctool\u2581sep\uff5c>read_file\n```json\n{"path": "/src/main.py"}\n```<\uff5ctool\u2581call\u2581end\uff5c>'
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "mistral": '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "/src/main.py"}, "id": "abcdefghi"}]',
}
PROFILE = {"name": "qwen3.5", "family": "qwen"}
"""The model profile under test (``--profile``); families other than Qwen have no thinking switch."""


class InstantEngine:
    """An SGLang ``/generate`` server that answers at once with fixed ids (raw asyncio HTTP/1.1)."""

    def __init__(self, output_ids: list[int]) -> None:
        self.output_ids = output_ids
        self.server: asyncio.Server | None = None
        self.port = 0

    def _answer(self, path: str, body: bytes) -> tuple[bytes, bytes]:
        """(content type, body): ``/generate`` streams one SSE chunk when asked to."""
        stream = False
        if path == "/generate":
            req = json.loads(body)
            stream = bool(req.get("stream"))
            n = len(self.output_ids)
            payload: Any = {
                "text": "",
                "output_ids": self.output_ids,
                "meta_info": {
                    "id": req.get("rid") or "x",
                    "finish_reason": {"type": "stop", "matched": self.output_ids[-1]},
                    "prompt_tokens": len(req["input_ids"]),
                    "completion_tokens": n,
                    "cached_tokens": 0,
                    "weight_version": "0",
                    "weight_versions": [{"version": "0", "start": 0, "end": n}],
                    "output_token_logprobs": [[-0.5, t, None] for t in self.output_ids],
                },
            }
        elif path == "/model_info":
            payload = {"model_path": "instant", "weight_version": "0", "max_context": 262144}
        else:
            payload = {}
        if stream:
            return b"text/event-stream", b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"
        return b"application/json", json.dumps(payload).encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                kind, data = self._answer(path, body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: "
                    + kind
                    + b"\r\nContent-Length: "
                    + str(len(data)).encode()
                    + b"\r\n\r\n"
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def tool_result(turn: int) -> str:
    """A ~300-token tool result that differs every turn."""
    return "\n".join(
        f"{turn:03d}.{i:02d} def handler_{turn}_{i}(request): return process(request, {i})" for i in range(12)
    )


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def sse_events(raw: str) -> list[tuple[str, Any]]:
    """(event name or "", parsed data) of every server-sent event in a body."""
    out: list[tuple[str, Any]] = []
    for block in raw.split("\n\n"):
        name, data = "", ""
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data and data != "[DONE]":
            out.append((name, json.loads(data)))
    return out


class ChatLoop:
    """An agent speaking chat completions."""

    path = "/chat/completions"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Find the bug in main.py."},
        ]

    def body(self, stream: bool) -> dict[str, Any]:
        body = {"model": "m", "messages": self.messages, "tools": TOOLS, "max_tokens": 64, "stream": stream}
        if PROFILE["family"] == "qwen":
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    def extend(self, raw: str, stream: bool, turn: int) -> None:
        if stream:
            calls = [
                c
                for _, e in sse_events(raw)
                for ch in e["choices"]
                for c in ch["delta"].get("tool_calls", [])
            ]
            msg = {
                "content": None,
                "tool_calls": [{k: c[k] for k in ("id", "type", "function")} for c in calls],
            }
        else:
            msg = json.loads(raw)["choices"][0]["message"]
        assert msg.get("tool_calls"), raw[:500]
        self.messages.append(
            {"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]}
        )
        self.messages.append(
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": tool_result(turn)}
        )


class MessagesLoop:
    """An agent speaking Anthropic Messages (as Claude Code does: tool_use blocks back, tool_result blocks)."""

    path = "/messages"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the bug in main.py."}]

    def body(self, stream: bool) -> dict[str, Any]:
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
        return {"model": "m", "system": "You are a coding agent.", "messages": self.messages, "tools": tools,
                "max_tokens": 64, "stream": stream, "thinking": {"type": "disabled"}}  # fmt: skip

    def extend(self, raw: str, stream: bool, turn: int) -> None:
        if stream:
            blocks = [e["content_block"] for name, e in sse_events(raw) if name == "content_block_start"]
            inputs = [e["delta"]["partial_json"] for name, e in sse_events(raw)
                      if name == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]  # fmt: skip
            uses = [
                {**b, "input": json.loads(i)}
                for b, i in zip([b for b in blocks if b["type"] == "tool_use"], inputs, strict=True)
            ]
        else:
            uses = [b for b in json.loads(raw)["content"] if b["type"] == "tool_use"]
        assert uses, raw[:500]
        self.messages.append({"role": "assistant", "content": uses})
        result = {"type": "tool_result", "tool_use_id": uses[0]["id"], "content": tool_result(turn)}
        self.messages.append({"role": "user", "content": [result]})


class ResponsesLoop:
    """An agent speaking OpenAI Responses statelessly (as Codex does: every item sent back)."""

    path = "/responses"

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": "Find the bug in main.py."}
        ]

    def body(self, stream: bool) -> dict[str, Any]:
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        return {"model": "m", "instructions": "You are a coding agent.", "input": self.items, "tools": tools,
                "max_output_tokens": 64, "stream": stream, "store": False, "reasoning": {"effort": "none"}}  # fmt: skip

    def extend(self, raw: str, stream: bool, turn: int) -> None:
        if stream:
            output = next(
                e["response"]["output"] for name, e in sse_events(raw) if name == "response.completed"
            )
        else:
            output = json.loads(raw)["output"]
        calls = [item for item in output if item["type"] == "function_call"]
        assert calls, raw[:500]
        self.items += output
        self.items.append(
            {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": tool_result(turn)}
        )


LOOPS = {"chat": ChatLoop, "messages": MessagesLoop, "responses": ResponsesLoop}
WARMUP = 5


async def timed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, str, httpx.Headers]:
    """Milliseconds from send to the last byte, the body, the headers."""
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body) as r:
        raw = (await r.aread()).decode()
    elapsed = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {raw[:500]}")
    return elapsed, raw, r.headers


async def run_loop(
    server: ProxyServer, engine_url: str, run: str, dialect: str, stream: bool, turns: int
) -> dict[str, Any]:
    handle = await server.open_session(run)
    loop = LOOPS[dialect]()
    added: list[float] = []
    overhead: list[float] = []
    async with httpx.AsyncClient(timeout=30) as client:
        for turn in range(turns):
            proxied, raw, headers = await timed(client, handle.base_url + loop.path, loop.body(stream))
            prompt_len = int(headers.get("x-dressage-prompt-tokens", "0"))
            direct_body = {
                "input_ids": [0] * prompt_len,
                "sampling_params": {"max_new_tokens": 64},
                "return_logprob": True,
            }
            direct, _, _ = await timed(client, engine_url + "/generate", direct_body)
            added.append(proxied - direct)
            if "x-dressage-overhead-ms" in headers:
                overhead.append(float(headers["x-dressage-overhead-ms"]))
            loop.extend(raw, stream, turn)
    recorded = await asyncio.to_thread(
        server.service.store.turns.read, run, session_id=handle.session_id, with_experts=False
    )
    last = recorded[-1]
    warm = added[WARMUP:] or added
    k = min(5, len(warm))
    return {
        "dialect": dialect,
        "stream": stream,
        "turns": len(recorded),
        "segments": len({t.segment_index for t in recorded}),
        "tokens": int(last.segment_offset + last.context_ids.size + last.generated_ids.size),
        "cold": added[0],
        "p50": statistics.median(warm),
        "p99": pct(warm, 99),
        "growth": statistics.mean(warm[-k:]) / statistics.mean(warm[:k]),
        "server_p50": statistics.median(overhead) if overhead else float("nan"),
    }


async def run_backend(url: str, turns: int, dialects: list[str]) -> list[dict[str, Any]]:
    profile = get_profile(PROFILE["name"])
    call_text = CALL_TEXTS[PROFILE["family"]]
    engine = InstantEngine([*profile.tokenizer.encode(call_text), profile.stop_token_ids[0]])
    engine_url = await engine.start()
    store = EventStore.open(
        settings=Settings(database_url=url, home=Path(tempfile.mkdtemp())), auto_upgrade=False
    )
    server = ProxyServer(store, [engine_url], settings=Settings(), profile=PROFILE["name"])
    await server.start()
    run = f"bench-{int(time.time() * 1000)}"
    await server.create_run(run, {})
    results = []
    try:
        for dialect in dialects:
            for stream in (False, True):
                results.append(await run_loop(server, engine_url, run, dialect, stream, turns))
    finally:
        await server.stop()
        await engine.stop()
        store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--dialects", default=None, help="Default: chat,messages,responses (Qwen), chat (others)."
    )
    parser.add_argument(
        "--profile", default="qwen3.5", help="Model profile (qwen3.5, qwen3.6, deepseek-v3, ...)."
    )
    args = parser.parse_args()
    family = next((f for f in CALL_TEXTS if args.profile.startswith(f)), None)
    if family is None:
        parser.error(f"no fixed reply for profile {args.profile!r}; add one to CALL_TEXTS")
    PROFILE.update(name=args.profile, family=family)
    default = "chat,messages,responses" if family == "qwen" else "chat"  # the others turn thinking off
    dialects = [d for d in (args.dialects or default).split(",") if d]
    print(f"profile {args.profile}")
    unknown = set(dialects) - set(LOOPS)
    if unknown:
        parser.error(f"unknown dialect(s) {', '.join(sorted(unknown))}; choose from {', '.join(LOOPS)}")
    sqlite = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    upgrade(sqlite)
    backends = [("sqlite", sqlite)]
    admin = os.environ.get("DRESSAGE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with contextlib.ExitStack() as stack:  # drops the PostgreSQL bench database at the end
        try:
            backends.append(("postgresql", stack.enter_context(fresh_database(admin, connect_timeout=3)).url))
        except Exception as e:  # top level of a benchmark: report and skip the backend
            print(f"PostgreSQL skipped: {e}", file=sys.stderr)
        print(f"{'backend':<11} {'dialect':<9} {'stream':<6} {'turns':>5} {'segs':>4} {'tokens':>6} {'cold ms':>7} "
              f"{'p50 ms':>7} {'p99 ms':>7} {'t100/t1':>7} {'server p50':>10}  target")  # fmt: skip
        for name, url in backends:
            for r in asyncio.run(run_backend(url, args.turns, dialects)):
                met = r["growth"] <= 1.5 and (name != "postgresql" or r["p50"] <= 3.0) and r["segments"] == 1
                print(
                    f"{name:<11} {r['dialect']:<9} {str(r['stream']).lower():<6} {r['turns']:>5} {r['segments']:>4} "
                    f"{r['tokens']:>6} {r['cold']:>7.2f} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['growth']:>7.2f} "
                    f"{r['server_p50']:>10.2f}  {'met' if met else 'NOT met'}"
                )
    print(
        "targets: p50 added <= 3 ms (PostgreSQL), t100/t1 <= 1.5, one segment per loop (token-exact appends)"
    )


if __name__ == "__main__":
    main()
