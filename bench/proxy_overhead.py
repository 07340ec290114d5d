"""Latency the TITO proxy adds per turn, with the durable append, on SQLite and PostgreSQL.

A 100-turn tool loop (one tool call per turn, ~300-token tool results) grows the conversation
to about 30k tokens, against an engine that answers instantly: a minimal SGLang-protocol server
written here (a benchmark harness, not a test double) that returns a fixed tool call with
logprobs. Printed per backend:

* proxy-added latency per turn, p50/p99: the server-side request time minus the engine call
  (parse, auth, render + incremental tokenization, durable append, reply), from the
  ``x-dressage-overhead-ms`` header; and the client-observed round trip for reference;
* the ratio of turn-100 to turn-1 cost (mean of the last 5 over the first 5 turns; target <= 1.5);
* the baseline measured in the same run: re-rendering and re-tokenizing the whole conversation
  each turn, and the ratio proxy-overhead / baseline at turn 100.

Target: p50 <= 3 ms with PostgreSQL. Run: ``python bench/proxy_overhead.py [--turns 100]``.
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
import unicodedata
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
CALL_TEXTS = {  # the engine's fixed reply per model family (``--profile``): one read_file call
    "qwen": CALL_TEXT,
    "deepseek": "Read it.</think><\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function"
    '<\uff5ctool\u2581sep\uff5c>read_file\n```json\n{"path": "/src/main.py"}\n```<\uff5ctool\u2581call\u2581end\uff5c>'
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "mistral": '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "/src/main.py"}, "id": "abcdefghi"}]',
}
THINKING_SWITCH = {"qwen": False, "deepseek": None, "mistral": None}  # families without one get none


class InstantEngine:
    """An SGLang ``/generate`` server that answers at once with fixed ids (raw asyncio HTTP/1.1)."""

    def __init__(self, output_ids: list[int]) -> None:
        self.output_ids = output_ids
        self.server: asyncio.Server | None = None
        self.port = 0

    def _answer(self, path: str, body: bytes) -> bytes:
        if path == "/generate":
            req = json.loads(body)
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
        return json.dumps(payload).encode()

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
                data = self._answer(path, body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
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


async def run_backend(name: str, url: str, turns: int, profile_name: str = "qwen3.5") -> dict[str, Any]:
    profile = get_profile(profile_name)
    family = profile_name.split("3")[0].split("-")[0]
    thinking = THINKING_SWITCH[family]
    tok = profile.tokenizer
    engine = InstantEngine([*tok.encode(CALL_TEXTS[family]), profile.stop_token_ids[0]])
    engine_url = await engine.start()
    store = EventStore.open(
        settings=Settings(database_url=url, home=Path(tempfile.mkdtemp())), auto_upgrade=False
    )
    server = ProxyServer(store, [engine_url], settings=Settings(), profile=profile_name)
    await server.start()
    run = f"bench-{int(time.time() * 1000)}"
    await server.create_run(run, {})
    handle = await server.open_session(run)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the bug in main.py."},
    ]
    overhead: list[float] = []
    e2e: list[float] = []
    baseline: list[float] = []
    async with httpx.AsyncClient(base_url=handle.base_url, timeout=30) as client:
        for turn in range(turns):
            body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 64}
            if thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": thinking}
            t0 = time.perf_counter()
            r = await client.post("/chat/completions", json=body)
            e2e.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
            overhead.append(float(r.headers["x-dressage-overhead-ms"]))
            msg = r.json()["choices"][0]["message"]
            assert msg.get("tool_calls"), msg
            t1 = time.perf_counter()  # baseline: re-render + re-tokenize everything
            text = profile.render(messages, TOOLS, True, thinking)
            tok.encode(unicodedata.normalize("NFC", text) if profile.normalizes_nfc else text)
            baseline.append((time.perf_counter() - t1) * 1000)
            messages.append({"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]})
            messages.append(
                {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": tool_result(turn)}
            )
    recorded = await asyncio.to_thread(
        store.read_turns, run, session_id=handle.session_id, with_experts=False
    )
    await server.stop()
    await engine.stop()
    store.close()
    segments = {t.segment_index for t in recorded}
    total_tokens = (
        recorded[-1].segment_offset + recorded[-1].context_ids.size + recorded[-1].generated_ids.size
    )
    k = min(5, turns)
    return {
        "backend": name,
        "turns": len(recorded),
        "segments": len(segments),
        "tokens": int(total_tokens),
        "p50": statistics.median(overhead),
        "p99": pct(overhead, 99),
        "e2e_p50": statistics.median(e2e),
        "growth": statistics.mean(overhead[-k:]) / statistics.mean(overhead[:k]),
        "baseline_last": statistics.mean(baseline[-k:]),
        "overhead_last": statistics.mean(overhead[-k:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--profile", default="qwen3.5", help="Model profile (see dressage.tito.profiles).")
    args = parser.parse_args()
    print(f"profile {args.profile}")
    sqlite = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    upgrade(sqlite)
    backends = [("sqlite", sqlite)]
    admin = os.environ.get("DRESSAGE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with contextlib.ExitStack() as stack:  # drops the PostgreSQL bench database at the end
        try:
            backends.append(("postgresql", stack.enter_context(fresh_database(admin, connect_timeout=3)).url))
        except Exception as e:  # top level of a benchmark: report and skip the backend
            print(f"PostgreSQL skipped: {e}", file=sys.stderr)
        print(f"{'backend':<11} {'turns':>5} {'segs':>4} {'tokens':>6} {'p50 ms':>7} {'p99 ms':>7} {'e2e p50':>8} "
              f"{'t100/t1':>7} {'full re-tok ms':>14} {'proxy/full':>10}")  # fmt: skip
        for name, url in backends:
            r = asyncio.run(run_backend(name, url, args.turns, args.profile))
            print(
                f"{r['backend']:<11} {r['turns']:>5} {r['segments']:>4} {r['tokens']:>6} {r['p50']:>7.2f} "
                f"{r['p99']:>7.2f} {r['e2e_p50']:>8.2f} {r['growth']:>7.2f} {r['baseline_last']:>14.2f} "
                f"{r['overhead_last'] / r['baseline_last']:>10.2f}"
            )
    print(
        "targets: p50 <= 3 ms (PostgreSQL), t100/t1 <= 1.5; proxy/full < 1 means cheaper than re-tokenizing"
    )


if __name__ == "__main__":
    main()
