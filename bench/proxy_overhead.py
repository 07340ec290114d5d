"""Latency and CPU the TITO proxy adds per turn, as a client sees it, for every dialect, on SQLite and PostgreSQL.

A 100-turn tool loop (one tool call per turn, ~300-token tool results) grows the conversation
to about 30k tokens, against an engine that answers instantly: a minimal SGLang-protocol server
written here (a benchmark harness, not a test double) that returns a fixed tool call with
logprobs. Each dialect (chat completions, Anthropic Messages, OpenAI Responses, Gemini) runs the loop in
its own wire format, streaming and not. Three processes, as deployed: the engine, the proxy
(``dressage-worker proxy``, its own event loop) and this client. Per turn the client measures
send-to-last-byte through the proxy, then a direct engine call with a prompt of the same length
(the baseline, measured in the same run by the same client); the difference is what the proxy
adds: parse, auth, render + incremental tokenization, the durable append, the reply. The proxy's
CPU per turn is read from ``/proc/<pid>/task/*/schedstat`` (ns) around each proxied call.

Printed per (backend, dialect, stream), at turns 1, 10, 50 and 100 (samples: that turn +-2 turns
of ``--reps`` loops; turn 1 adds ``--first-turns`` one-turn sessions): added latency p50/p99,
proxy CPU ms/turn, and met/NOT met against the targets (PostgreSQL p50 <= 2 ms and p99 <= 6 ms,
SQLite p50 <= 3 ms, CPU <= 2.5 ms/turn at turn 100); the cold first turn of a fresh proxy. Then
N sessions (``--sessions``, 64) x ``--concurrent-turns`` (20) at once through one proxy against
the same client calling the engine directly: turns/s ratio (target >= 0.5), errors, p99. And the
load average (the machine is shared: noisy numbers).

Run: ``python bench/proxy_overhead.py [--turns 100] [--reps 3] [--dialects chat,messages,responses,gemini]
[--backends postgresql,sqlite]``. PostgreSQL: ``--pg-url`` (default ``DRESSAGE_BENCH_PG_URL`` or
``postgresql://postgres@127.0.0.1:5432/postgres``); the backend is skipped when unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from bench_db import add_database_options, migrated_database

from dressage.config import Settings
from dressage.proxy.eventloop import run as run_fast
from dressage.store import EventStore
from dressage.tito import get_profile

REPO = Path(__file__).resolve().parents[1]

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


class GeminiLoop:
    """An agent speaking the Gemini API (as the Gemini CLI does: the model's parts back, functionResponse parts)."""

    path = "/models/m:generateContent"
    stream_path = "/models/m:streamGenerateContent?alt=sse"

    def __init__(self) -> None:
        self.contents: list[dict[str, Any]] = [
            {"role": "user", "parts": [{"text": "Find the bug in main.py."}]}
        ]

    def body(self, stream: bool) -> dict[str, Any]:
        decls = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "parametersJsonSchema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
        return {"systemInstruction": {"parts": [{"text": "You are a coding agent."}]}, "contents": self.contents,
                "tools": [{"functionDeclarations": decls}],
                "generationConfig": {"maxOutputTokens": 64, "thinkingConfig": {"thinkingBudget": 0}}}  # fmt: skip

    def extend(self, raw: str, stream: bool, turn: int) -> None:
        chunks = [e for _, e in sse_events(raw)] if stream else [json.loads(raw)]
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        assert calls, raw[:500]
        self.contents.append({"role": "model", "parts": parts})
        answer = {"id": calls[0]["id"], "name": calls[0]["name"], "response": {"output": tool_result(turn)}}
        self.contents.append({"role": "user", "parts": [{"functionResponse": answer}]})


LOOPS = {"chat": ChatLoop, "messages": MessagesLoop, "responses": ResponsesLoop, "gemini": GeminiLoop}
WARMUP = 5


ADMIN = "bench-admin-token"
POINTS = (1, 10, 50, 100)
TARGETS = {"postgresql": (2.0, 6.0), "sqlite": (3.0, None)}
"""Per backend: p50 and p99 (None: no target) added ms at each turn point."""
CPU_TARGET = 2.5
THROUGHPUT_TARGET = 0.5


async def timed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[float, str, httpx.Headers]:
    """Milliseconds from send to the last byte, the body, the headers."""
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as r:
        raw = (await r.aread()).decode()
    elapsed = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {raw[:500]}")
    return elapsed, raw, r.headers


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far (ns, from schedstat)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError):
            with open(path) as f:
                total += int(f.read().split()[0])
    return total


class Child:
    """A child process that prints ``<tag>: <url> ...`` on stderr when it listens."""

    def __init__(self, args: list[str], tag: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        seen = []
        while True:
            line = self.proc.stderr.readline().decode(errors="replace")
            seen.append(line)
            if not line:
                raise RuntimeError(f"{tag} exited before listening:\n{''.join(seen)[-3000:]}")
            if line.startswith(f"{tag}: "):
                self.url = line.split()[1]
                break
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def serve_engine() -> None:
    """``--serve-engine``: the instant engine as its own process (prints ``engine: URL``)."""
    profile = get_profile(PROFILE["name"])
    engine = InstantEngine(
        [*profile.tokenizer.encode(CALL_TEXTS[PROFILE["family"]]), profile.stop_token_ids[0]]
    )

    async def main() -> None:
        url = await engine.start()
        print(f"engine: {url}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()

    run_fast(main())


@dataclass
class Samples:
    """Added ms and proxy CPU ms by turn number (1-based), and the prompt lengths seen."""

    added: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, list[float]] = field(default_factory=dict)
    segments: list[int] = field(default_factory=list)
    tokens: int = 0

    def add(self, turn: int, added: float, cpu: float) -> None:
        self.added.setdefault(turn, []).append(added)
        self.cpu.setdefault(turn, []).append(cpu)

    def around(self, what: str, turn: int, last: int) -> list[float]:
        """The samples of ``turn`` +-2 (turn 1: itself only, the cold-session turn)."""
        table = self.added if what == "added" else self.cpu
        lo, hi = (1, 1) if turn == 1 else (max(2, turn - 2), min(last, turn + 2))
        return [v for t in range(lo, hi + 1) for v in table.get(t, [])]


class Bench:
    """One backend: an engine process, a proxy process on a fresh database, this client."""

    def __init__(self, engine_url: str, proxy: Child, store: EventStore) -> None:
        self.engine_url, self.proxy, self.store = engine_url, proxy, store
        self.run = f"bench-{int(time.time() * 1000)}"
        self.auth = {"authorization": f"Bearer {ADMIN}"}

    async def open_session(self, client: httpx.AsyncClient) -> tuple[str, str]:
        """(session id, base URL with its token) of a new session."""
        r = await client.post(self.proxy.url + "/admin/sessions", json={"run": self.run}, headers=self.auth)
        r.raise_for_status()
        s = r.json()
        return s["session_id"], f"{self.proxy.url}/s/{s['token']}/v1"

    async def turn(
        self, client: httpx.AsyncClient, base: str, loop: Any, stream: bool, turn: int
    ) -> tuple[float, float, int, float, float]:
        """One proxied turn, then the direct call: (added ms, proxy CPU ms, prompt length, proxied ms, direct ms)."""
        before = cpu_ns(self.proxy.proc.pid)
        path = (
            getattr(loop, "stream_path", loop.path) if stream else loop.path
        )  # Gemini streams at its own URL
        proxied, raw, headers = await timed(client, base + path, loop.body(stream))
        cpu = (cpu_ns(self.proxy.proc.pid) - before) / 1e6
        prompt_len = int(headers.get("x-dressage-prompt-tokens", "0"))
        direct_body = {
            "input_ids": [0] * prompt_len,
            "sampling_params": {"max_new_tokens": 64},
            "return_logprob": True,
        }
        direct, _, _ = await timed(client, self.engine_url + "/generate", direct_body)
        loop.extend(raw, stream, turn)
        return proxied - direct, cpu, prompt_len, proxied, direct

    async def loop(
        self, client: httpx.AsyncClient, dialect: str, stream: bool, turns: int, into: Samples
    ) -> None:
        sid, base = await self.open_session(client)
        loop = LOOPS[dialect]()
        for turn in range(turns):
            added, cpu, _, _, _ = await self.turn(client, base, loop, stream, turn)
            into.add(turn + 1, added, cpu)
        recorded = await asyncio.to_thread(
            self.store.turns.read, self.run, session_id=sid, with_experts=False
        )
        last = recorded[-1]
        into.segments.append(len({t.segment_index for t in recorded}))
        into.tokens = int(last.segment_offset + last.context_ids.size + last.generated_ids.size)

    async def measure(
        self, args: argparse.Namespace, dialects: list[str]
    ) -> tuple[float, dict[tuple[str, bool], Samples]]:
        """The cold first turn, a warm-up, then every (dialect, stream) loop ``--reps`` times."""
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(
                self.proxy.url + "/admin/runs", json={"name": self.run, "config": {}}, headers=self.auth
            )
            r.raise_for_status()
            _, base = await self.open_session(client)
            cold, _, _, _, _ = await self.turn(client, base, LOOPS[dialects[0]](), False, 0)
            for dialect in dialects:  # warm-up: each dialect's code paths, both ways
                for stream in (False, True):
                    await self.loop(client, dialect, stream, 10, Samples())
            results = {(d, s): Samples() for d in dialects for s in (False, True)}
            for _ in range(args.reps):
                for (dialect, stream), samples in results.items():
                    await self.loop(client, dialect, stream, args.turns, samples)
            for (dialect, stream), samples in results.items():
                for _ in range(args.first_turns):
                    first = Samples()
                    await self.loop(client, dialect, stream, 1, first)
                    samples.add(1, first.added[1][0], first.cpu[1][0])
        return cold, results

    async def concurrent(self, sessions: int, turns: int) -> dict[str, Any]:
        """``sessions`` chat loops at once through the proxy, then the same calls direct to the engine."""
        limits = httpx.Limits(max_connections=sessions * 2, max_keepalive_connections=sessions * 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            bases = [(await self.open_session(client))[1] for _ in range(sessions)]
            lengths: list[list[int]] = [[] for _ in range(sessions)]
            errors = 0
            latency: list[float] = []

            async def agent(i: int) -> None:
                nonlocal errors
                loop = ChatLoop()
                for turn in range(turns):
                    try:
                        ms, raw, headers = await timed(client, bases[i] + loop.path, loop.body(False))
                    except (RuntimeError, httpx.HTTPError):
                        errors += 1
                        return
                    latency.append(ms)
                    lengths[i].append(int(headers.get("x-dressage-prompt-tokens", "0")))
                    loop.extend(raw, False, turn)

            t0 = time.perf_counter()
            await asyncio.gather(*(agent(i) for i in range(sessions)))
            proxied_s = time.perf_counter() - t0
            direct: list[float] = []

            async def direct_agent(i: int) -> None:
                for n in lengths[i]:
                    body = {
                        "input_ids": [0] * n,
                        "sampling_params": {"max_new_tokens": 64},
                        "return_logprob": True,
                    }
                    direct.append((await timed(client, self.engine_url + "/generate", body))[0])

            t0 = time.perf_counter()
            await asyncio.gather(*(direct_agent(i) for i in range(sessions)))
            direct_s = time.perf_counter() - t0
        done = sum(len(x) for x in lengths)
        return {
            "turns": done, "errors": errors, "proxied_tps": done / proxied_s, "direct_tps": done / direct_s,
            "p50": statistics.median(latency), "p99": pct(latency, 99),
            "direct_p50": statistics.median(direct), "direct_p99": pct(direct, 99),
        }  # fmt: skip


@contextlib.contextmanager
def bench_processes(url: str, engine_url: str) -> Iterator[Bench]:
    """A proxy process on database ``url`` (fresh, migrated) and a store for the checks."""
    home = Path(tempfile.mkdtemp())
    proxy = Child(
        [sys.executable, "-c", "from dressage.cli import main; main()", "proxy", "--engine-url", engine_url,
         "--port", "0", "--database-url", url, "--profile", PROFILE["name"], "--context-window", "262144",
         "--log-level", "warning"],
        "proxy", env={"DRESSAGE_HOME": str(home), "DRESSAGE_ADMIN_TOKEN": ADMIN},
    )  # fmt: skip
    print(f"proxy pid {proxy.proc.pid}", file=sys.stderr, flush=True)  # for py-spy --pid
    store = EventStore.open(settings=Settings(database_url=url, home=home), auto_upgrade=False)
    try:
        yield Bench(engine_url, proxy, store)
    finally:
        proxy.stop()
        store.close()


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(name: str, cold: float, results: dict[tuple[str, bool], Samples], turns: int) -> list[bool]:
    """Print one backend's rows; the verdicts."""
    p50_target, p99_target = TARGETS[name]
    verdicts = []
    print(f"{name}: cold first turn of a fresh proxy {cold:.2f} ms added")
    for (dialect, stream), s in results.items():
        for point in [p for p in POINTS if p <= turns]:
            added, cpu = s.around("added", point, turns), s.around("cpu", point, turns)
            p50, p99, cpu50 = statistics.median(added), pct(added, 99), statistics.median(cpu)
            ok = p50 <= p50_target and (p99_target is None or p99 <= p99_target) and set(s.segments) == {1}
            if point == turns or point == 100:
                ok = ok and cpu50 <= CPU_TARGET
            verdicts.append(ok)
            print(f"{name:<11} {dialect:<9} {str(stream).lower():<6} {point:>4} {len(added):>4} {p50:>7.2f} {p99:>7.2f} "
                  f"{cpu50:>7.2f} {max(s.segments):>4} {s.tokens:>6}  {verdict(ok)}")  # fmt: skip
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3, help="Loops per (dialect, stream).")
    parser.add_argument(
        "--first-turns", type=int, default=10, help="Extra one-turn sessions per (dialect, stream)."
    )
    parser.add_argument("--sessions", type=int, default=64, help="Concurrent sessions (0: skip).")
    parser.add_argument("--concurrent-turns", type=int, default=20)
    parser.add_argument(
        "--dialects", default=None, help="Default: chat,messages,responses,gemini (Qwen), chat (others)."
    )
    parser.add_argument(
        "--profile", default="qwen3.5", help="Model profile (qwen3.5, qwen3.6, deepseek-v3, ...)."
    )
    parser.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    add_database_options(parser)
    args = parser.parse_args()
    family = next((f for f in CALL_TEXTS if args.profile.startswith(f)), None)
    if family is None:
        parser.error(f"no fixed reply for profile {args.profile!r}; add one to CALL_TEXTS")
    PROFILE.update(name=args.profile, family=family)
    if args.serve_engine:
        return serve_engine()
    default = "chat,messages,responses,gemini" if family == "qwen" else "chat"  # the others turn thinking off
    dialects = [d for d in (args.dialects or default).split(",") if d]
    unknown = set(dialects) - set(LOOPS)
    if unknown:
        parser.error(f"unknown dialect(s) {', '.join(sorted(unknown))}; choose from {', '.join(LOOPS)}")
    print(
        f"profile {args.profile}; {os.cpu_count()} CPUs; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    engine = Child([sys.executable, __file__, "--serve-engine", "--profile", args.profile], "engine")
    verdicts: list[bool] = []
    try:
        for name in [b for b in args.backends.split(",") if b]:
            try:
                database = migrated_database(name, args.pg_url)
                url = database.__enter__()
            except Exception as e:  # top level of a benchmark: report and skip the backend
                print(f"{name} skipped: {e}", file=sys.stderr)
                continue
            try:
                with bench_processes(url, engine.url) as bench:
                    cold, results = asyncio.run(bench.measure(args, dialects))
                    print(f"{'backend':<11} {'dialect':<9} {'stream':<6} {'turn':>4} {'n':>4} {'p50 ms':>7} {'p99 ms':>7} "
                          f"{'cpu ms':>7} {'segs':>4} {'tokens':>6}  target")  # fmt: skip
                    verdicts += report(name, cold, results, args.turns)
                    if args.sessions:
                        c = asyncio.run(bench.concurrent(args.sessions, args.concurrent_turns))
                        ratio = c["proxied_tps"] / c["direct_tps"]
                        ok = ratio >= THROUGHPUT_TARGET and c["errors"] == 0
                        verdicts.append(ok)
                        print(f"{name}: {args.sessions} sessions x {args.concurrent_turns} turns: {c['turns']} turns, "
                              f"{c['proxied_tps']:.0f} turns/s proxied vs {c['direct_tps']:.0f} direct = {ratio:.2f}x, "
                              f"{c['errors']} errors, p50/p99 {c['p50']:.1f}/{c['p99']:.1f} ms proxied, "
                              f"{c['direct_p50']:.1f}/{c['direct_p99']:.1f} ms direct  {verdict(ok)}")  # fmt: skip
            finally:
                database.__exit__(None, None, None)
    finally:
        engine.stop()
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"targets: added p50/p99 <= 2/6 ms (PostgreSQL), p50 <= 3 ms (SQLite) at turns {', '.join(map(str, POINTS))}; "
          f"proxy CPU <= {CPU_TARGET} ms/turn at turn 100; {args.sessions} sessions >= {THROUGHPUT_TARGET}x direct "
          f"turns/s, 0 errors; one segment per loop (token-exact). {sum(verdicts)} of {len(verdicts)} rows met")  # fmt: skip


if __name__ == "__main__":
    main()
