"""Hostile input against every route: a clear 4xx each time, no 5xx, no hang, nothing half-written.

Over 150 requests built from the findings of an attack run and from each dialect's own fields
(malformed JSON, wrong types, out-of-range numbers, deep nesting, oversized bodies, broken tool
calls and schemas, bad tokens, admin mistakes, a re-used ``Idempotency-Key``). Afterwards the
proxy must be healthy, a valid tool loop must still append token-exactly, and the session's
turns must be dense (no index lost to a failed request). Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dressage.store import EventStore
from tests.proxy.conftest import ADMIN, Harness, LoopThread
from tests.proxy.test_dialects import two_step
from tests.scripted_engine import ScriptedEngine

FN = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
MSGS = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi", "max_output_tokens": 8}
GEM = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 8}}


def deep(n: int) -> str:
    """A placeholder for ``n`` nested arrays, spliced in as raw JSON by :func:`encode`."""
    return f"__DEEP_{n}__"


def deep_text(n: int) -> str:
    """``n`` nested JSON arrays as text (json.dumps itself cannot nest that deep)."""
    return "[" * n + "1" + "]" * n


def encode(body: Any) -> bytes:
    """JSON bytes of a body, with :func:`deep` placeholders expanded."""
    if isinstance(body, bytes):
        return body
    text = json.dumps(body)
    for n in (200, 1000, 1100):
        text = text.replace(json.dumps(deep(n)), deep_text(n))
    return text.encode()


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


def raw_bodies() -> list[bytes]:
    """Bodies that are not a usable JSON object."""
    return [b"", b"{", b"[]", b"null", b"123", b'"text"', b"\xff\xfe\x00", b"{\"a\": NaN}", b"{\"a\": 1e999}",
            b"{\"messages\": [}", b'{"a": "\\ud800"}', deep_text(1100).encode()]  # fmt: skip


def chat_bodies() -> list[dict[str, Any]]:
    msg = CHAT["messages"]
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{not json"}}
    deep_args = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": deep_text(1000)}}
    return [
        _with(CHAT, messages=None), _with(CHAT, messages={}), _with(CHAT, messages=[]), _with(CHAT, messages="hi"),
        _with(CHAT, messages=[1]), _with(CHAT, messages=[{"role": 5}]), _with(CHAT, messages=[{"role": "robot", "content": "x"}]),
        _with(CHAT, messages=[{"role": "user", "content": 5}]),
        _with(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        _with(CHAT, messages=[{"role": "user", "content": [{"type": "video"}]}]),
        _with(CHAT, messages=[{"role": "user", "content": [5]}]),
        _with(CHAT, messages=[*msg, {"role": "assistant", "content": None, "tool_calls": [call]}]),
        _with(CHAT, messages=[*msg, {"role": "assistant", "content": None, "tool_calls": [deep_args]}]),
        _with(CHAT, messages=[*msg, {"role": "assistant", "content": None, "tool_calls": "x"}]),
        _with(CHAT, messages=[*msg, {"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": "[1]"}}]}]),
        _with(CHAT, messages=[{"role": "system", "content": "a"}, *msg, {"role": "system", "content": "late"}]),
        _with(CHAT, messages=[{"role": "user", "content": deep(1000)}]),
        _with(CHAT, messages=[{"role": "user", "content": "x" * 300_000}]),
        _with(CHAT, tools="x"), _with(CHAT, tools=[5]), _with(CHAT, tools=[{"type": "function"}]),
        _with(CHAT, tools=[{"type": "function", "function": {"name": "ls", "parameters": "not a schema"}}]),
        _with(CHAT, tools=[{"type": "function", "function": {"name": "ls", "parameters": deep(1000)}}]),
        _with(CHAT, tools=[{"type": "function", "function": {"name": 5}}]),
        _with(CHAT, tools=[{"type": "retrieval"}]), _with(CHAT, tools=[FN], tool_choice="sometimes"),
        _with(CHAT, tools=[FN], tool_choice={"type": "function", "function": {"name": "rm"}}),
        _with(CHAT, tool_choice="required"), _with(CHAT, tools=[FN], tool_choice={"type": "function"}),
        _with(CHAT, temperature=-1), _with(CHAT, temperature="hot"), _with(CHAT, temperature=True),
        _with(CHAT, temperature=9), _with(CHAT, top_p=0), _with(CHAT, top_p=2), _with(CHAT, top_k=0),
        _with(CHAT, top_k="5"), _with(CHAT, min_p=-0.5), _with(CHAT, max_tokens=0), _with(CHAT, max_tokens=-1),
        _with(CHAT, max_tokens="5"), _with(CHAT, max_tokens=2**40), _with(CHAT, max_completion_tokens=0),
        _with(CHAT, stop=["a", "b", "c", "d", "e"]), _with(CHAT, stop=[""]), _with(CHAT, stop=5),
        _with(CHAT, stream="yes"), _with(CHAT, stream_options="x"), _with(CHAT, logprobs="x"),
        _with(CHAT, seed=2**70), _with(CHAT, seed="x"), _with(CHAT, model=5),
        _with(CHAT, chat_template_kwargs="x"), _with(CHAT, chat_template_kwargs={"enable_thinking": "yes"}),
        _with(CHAT, functions=[{"name": "x"}]), _with(CHAT, function_call="auto"), _with(CHAT, logit_bias={"1": 5}),
        _with(CHAT, audio={"voice": "x"}), _with(CHAT, modalities=["audio"]), _with(CHAT, top_logprobs=99),
        _with(CHAT, top_logprobs="x"), _with(CHAT, presence_penalty=5), _with(CHAT, frequency_penalty="x"),
        _with(CHAT, response_format="json"), _with(CHAT, response_format={"type": "xml"}),
        _with(CHAT, n=0), _with(CHAT, n="2"), _with(CHAT, prediction={"type": "content", "content": "x"}),
        _with(CHAT, web_search_options={}), _with(CHAT, metadata=deep(200)),
    ]  # fmt: skip


def messages_bodies() -> list[dict[str, Any]]:
    tool = {"name": "ls", "input_schema": {"type": "object"}}
    use = {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}
    return [
        _with(MSGS, max_tokens=None), _with(MSGS, max_tokens=0), _with(MSGS, max_tokens="8"), _with(MSGS, messages=[]),
        _with(MSGS, messages=None), _with(MSGS, messages=[{"role": "tool", "content": "x"}]),
        _with(MSGS, messages=[{"role": "user", "content": 5}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "document"}]}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "mystery"}]}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]),
        _with(MSGS, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "x"}]}]),
        _with(MSGS, messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls"}]}]),
        _with(MSGS, messages=[{"role": "assistant", "content": [{**use, "input": "x"}]}]),
        _with(MSGS, messages=[{"role": "assistant", "content": [{**use, "input": deep(1000)}]}]),
        _with(MSGS, messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": 5}]}]),
        _with(MSGS, messages=[{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]),
        _with(MSGS, system=5), _with(MSGS, system=[{"type": "image"}]), _with(MSGS, system=[5]),
        _with(MSGS, tools="x"), _with(MSGS, tools=[5]), _with(MSGS, tools=[{"name": "ls"}]),
        _with(MSGS, tools=[{"name": "ls", "input_schema": "not a schema"}]),
        _with(MSGS, tools=[{"name": "", "input_schema": {}}]),
        _with(MSGS, tools=[{"type": "bash_20250124", "name": "bash"}]),
        _with(MSGS, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        _with(MSGS, tools=[tool], tool_choice="auto"), _with(MSGS, tools=[tool], tool_choice={"type": "sometimes"}),
        _with(MSGS, tools=[tool], tool_choice={"type": "tool", "name": "rm"}), _with(MSGS, tool_choice={"type": "any"}),
        _with(MSGS, thinking="on"), _with(MSGS, thinking={"type": "maybe"}),
        _with(MSGS, thinking={"type": "enabled", "budget_tokens": -5}),
        _with(MSGS, stop_sequences="x"), _with(MSGS, stop_sequences=[""]), _with(MSGS, temperature=1.5),
        _with(MSGS, temperature="x"), _with(MSGS, top_k=0), _with(MSGS, top_p=5), _with(MSGS, stream=1),
        _with(MSGS, model=[]), _with(MSGS, frobnicate=True), _with(MSGS, container="x"), _with(MSGS, mcp_servers=[{}]),
    ]  # fmt: skip


def responses_bodies() -> list[dict[str, Any]]:
    return [
        _with(RESP, input=5), _with(RESP, input=None), _with(RESP, input=[5]), _with(RESP, input=[{"type": "mystery"}]),
        _with(RESP, input=[{"type": "message", "role": "robot", "content": "x"}]),
        _with(RESP, input=[{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]),
        _with(RESP, input=[{"type": "message", "role": "user", "content": [{"type": "input_file"}]}]),
        _with(RESP, input=[{"type": "function_call", "name": "ls", "arguments": "{}"}]),
        _with(RESP, input=[{"type": "function_call", "call_id": "c", "name": "ls", "arguments": {}}]),
        _with(RESP, input=[{"type": "function_call_output", "output": "x"}]),
        _with(RESP, input=[{"type": "function_call_output", "call_id": "c", "output": 5}]),
        _with(RESP, input=[{"type": "reasoning", "encrypted_content": "%%%not-base64"}]),
        _with(RESP, input=[{"type": "reasoning", "summary": [5]}]),
        _with(RESP, input=[{"type": "item_reference", "id": "x"}]),
        _with(RESP, input=[{"type": "function_call", "call_id": "c", "name": "ls", "arguments": deep_text(1000)},
                          {"type": "function_call_output", "call_id": "c", "output": "x"}]),
        _with(RESP, previous_response_id=5), _with(RESP, previous_response_id="resp_unknown"),
        _with(RESP, tools="x"), _with(RESP, tools=[{"type": "custom", "name": "apply_patch"}]),
        _with(RESP, tools=[{"type": "function", "name": "ls", "parameters": "not a schema"}]),
        _with(RESP, tools=[{"type": "function"}]), _with(RESP, tools=[{"type": "namespace", "name": "n", "tools": 5}]),
        _with(RESP, tools=[{"type": "namespace", "name": "n", "tools": [{"type": "custom", "name": "x"}]}]),
        _with(RESP, tool_choice="sometimes"), _with(RESP, tool_choice={"type": "function", "name": "rm"}),
        _with(RESP, tool_choice="required"), _with(RESP, include=["file_search_call.results"]), _with(RESP, include="x"),
        _with(RESP, text={"format": {"type": "json_schema"}}), _with(RESP, reasoning="high"),
        _with(RESP, reasoning={"effort": "turbo"}), _with(RESP, max_output_tokens=0), _with(RESP, temperature=-2),
        _with(RESP, store="yes"), _with(RESP, background=True), _with(RESP, instructions=5), _with(RESP, stream="x"),
        _with(RESP, conversation="c"), _with(RESP, truncation="middle"), _with(RESP, truncation=5),
    ]  # fmt: skip


def gemini_bodies() -> list[dict[str, Any]]:
    fd = {"name": "ls", "parameters": {"type": "OBJECT"}}
    call = {"functionCall": {"name": "ls", "args": {}}}

    def c(*parts: Any, role: str = "user") -> dict[str, Any]:
        return _with(GEM, contents=[{"role": role, "parts": list(parts)}])

    return [
        _with(GEM, contents=None), _with(GEM, contents=[]), _with(GEM, contents="hi"), _with(GEM, contents=[5]),
        _with(GEM, contents=[{"role": "system", "parts": [{"text": "x"}]}]), c({}), c({"text": 5}), c({"mystery": 1}),
        c({"inlineData": {"mimeType": "image/png", "data": "AA=="}}), c({"fileData": {"fileUri": "gs://x"}}),
        c({"executableCode": {"code": "1"}}), c(call), c({"text": "x", "thought": True}),
        c({"functionResponse": {"name": "ls"}}), c({"functionResponse": {"name": "ls", "response": "x"}}),
        c({"functionResponse": {"name": "ls", "response": deep(1000)}}),
        c({"functionCall": {"name": "ls", "args": "x"}}, role="model"), c({"functionCall": {"args": {}}}, role="model"),
        c({"text": "x", "thoughtSignature": "%%%"}, role="model"), c({"text": "x", "thoughtSignature": 5}, role="model"),
        c({"functionResponse": {"name": "ls", "response": {}}}, role="model"),
        _with(GEM, systemInstruction="x"), _with(GEM, systemInstruction={"parts": [call]}),
        _with(GEM, tools="x"), _with(GEM, tools=[5]), _with(GEM, tools=[{}]), _with(GEM, tools=[{"codeExecution": {}}]),
        _with(GEM, tools=[{"functionDeclarations": [{"name": ""}]}]),
        _with(GEM, tools=[{"functionDeclarations": [{"name": "ls", "parameters": "x"}]}]),
        _with(GEM, tools=[{"functionDeclarations": [{"name": "ls", "parameters": {"type": 5}}]}]),
        _with(GEM, tools=[{"functionDeclarations": [{"name": "ls", "parameters": {"type": "OBJECT", "properties": {"a": 5}}}]}]),
        _with(GEM, tools=[{"functionDeclarations": [{**fd, "parametersJsonSchema": {}}]}]),
        _with(GEM, tools=[{"functionDeclarations": [{**fd, "behavior": "NON_BLOCKING"}]}]),
        _with(GEM, toolConfig={"functionCallingConfig": {"mode": "ANY"}}),
        _with(GEM, tools=[{"functionDeclarations": [fd]}], toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["rm"]}}),
        _with(GEM, tools=[{"functionDeclarations": [fd]}], toolConfig={"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["ls"]}}),
        _with(GEM, toolConfig={"functionCallingConfig": {"mode": "VALIDATED"}}), _with(GEM, toolConfig="x"),
        _with(GEM, generationConfig="x"), _with(GEM, generationConfig={"temperature": 3}),
        _with(GEM, generationConfig={"temperature": True}), _with(GEM, generationConfig={"topK": 0}),
        _with(GEM, generationConfig={"maxOutputTokens": 0}), _with(GEM, generationConfig={"maxOutputTokens": "8"}),
        _with(GEM, generationConfig={"stopSequences": "x"}), _with(GEM, generationConfig={"stopSequences": [""]}),
        _with(GEM, generationConfig={"candidateCount": 99}), _with(GEM, generationConfig={"seed": 2**40}),
        _with(GEM, generationConfig={"responseMimeType": "application/xml"}),
        _with(GEM, generationConfig={"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT", "oneOf": []}}),
        _with(GEM, generationConfig={"responseMimeType": "application/json", "responseSchema": {}, "responseJsonSchema": {}}),
        _with(GEM, generationConfig={"responseLogprobs": True}), _with(GEM, generationConfig={"responseModalities": ["IMAGE"]}),
        _with(GEM, generationConfig={"thinkingConfig": {"thinkingBudget": -7}}),
        _with(GEM, generationConfig={"thinkingConfig": {"thinkingBudget": 0, "thinkingLevel": "HIGH"}}),
        _with(GEM, generationConfig={"thinkingConfig": {"includeThoughts": "yes"}}),
        _with(GEM, safetySettings=[]), _with(GEM, cachedContent="cachedContents/x"), _with(GEM, labels={}),
    ]  # fmt: skip


def admin_requests(session_id: str) -> list[tuple[str, Any]]:
    """(path, JSON body or raw bytes) sent with the admin token."""
    fin = f"/admin/sessions/{session_id}/finalize"
    return [
        ("/admin/runs", {}), ("/admin/runs", {"name": ""}), ("/admin/runs", {"name": "   "}), ("/admin/runs", {"name": 5}),
        ("/admin/runs", {"name": "r", "config": "x"}), ("/admin/runs", {"name": "r-deep", "config": {"a": deep(1100)}}),
        ("/admin/runs", {"name": "r-nul", "config": {"a": "x\u0000y"}}), ("/admin/runs", b"{"),
        ("/admin/sessions", {}), ("/admin/sessions", {"run": "no-such-run"}),
        ("/admin/sessions", {"run": "fuzz", "task_id": 2**40}), ("/admin/sessions", {"run": "fuzz", "task_id": "x"}),
        ("/admin/sessions", {"run": "fuzz", "task_id": 999999}), ("/admin/sessions", {"run": "fuzz", "attempt": 2**33}),
        ("/admin/sessions", {"run": "fuzz", "info": deep(1100)}), ("/admin/sessions", {"run": "fuzz", "agent": 5}),
        ("/admin/sessions/nope/finalize", {"status": "finished"}), (fin, {}), (fin, {"status": "exploded"}),
        (fin, {"status": "finished", "reward": "x"}), (fin, {"status": "finished", "metadata": "x"}),
        ("/admin/resume", {"version": 2**40}), ("/admin/resume", {"version": "x"}),
    ]  # fmt: skip


@pytest.fixture
def proxy_f(loop_thread: LoopThread, store: EventStore) -> Iterator[Harness]:
    with ScriptedEngine(two_step).running() as eng:
        h = Harness(loop_thread, store, eng.url)
        yield h
        loop_thread.call(h.server.stop())


def test_hostile_requests_get_clear_4xx_and_lose_nothing(proxy_f: Harness) -> None:
    run = proxy_f.run("fuzz")
    s = proxy_f.session(run)
    sent: list[tuple[str, int, str]] = []
    with httpx.Client(base_url=proxy_f.server.base_url, timeout=30) as http:
        auth = {"authorization": f"Bearer {s.token}"}

        def send(path: str, body: Any, headers: dict[str, str]) -> None:
            r = http.post(path, content=encode(body), headers={"content-type": "application/json", **headers})
            sent.append((path, r.status_code, r.text[:300]))

        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            for raw in raw_bodies():
                send(path, raw, auth)
            send(path, b"x" * (300 * 1024), auth)  # over the harness's 256 KiB limit: 413
            send(path, CHAT, {})  # no token
            send(path, CHAT, {"authorization": "Bearer sk-not-a-session-token-0000"})
        for body in chat_bodies():
            send("/v1/chat/completions", body, auth)
        for body in messages_bodies():
            send("/v1/messages", body, {"x-api-key": s.token})
        for body in responses_bodies():
            send(f"/s/{s.token}/v1/responses", body, {})
        gemini = "/v1beta/models/m:generateContent"
        for raw in raw_bodies():
            send(gemini, raw, {"x-goog-api-key": s.token})
        send(gemini, GEM, {"x-goog-api-key": "not-a-session-key"})
        for body in gemini_bodies():
            send(f"{gemini}?key={s.token}", body, {})
        for path, body in admin_requests(s.session_id):
            send(path, body, {"authorization": f"Bearer {ADMIN}"})
        send("/admin/runs", {"name": "x"}, {"authorization": "Bearer wrong"})
        send("/v1/chat/completions", CHAT, {**auth, "idempotency-key": "k1"})
        send("/v1/chat/completions", _with(CHAT, max_tokens=9), {**auth, "idempotency-key": "k1"})
        assert http.get("/health").json()["status"] == "ok"

    assert len(sent) >= 150, len(sent)
    gemini_refused = [(code, text) for path, code, text in sent if "generateContent?key=" in path]
    assert gemini_refused and all(code == 400 for code, _ in gemini_refused), gemini_refused
    server_errors = [x for x in sent if x[1] >= 500]
    assert not server_errors, server_errors
    ok = [x for x in sent if x[1] < 400]
    assert len(ok) <= 12, ok  # the few valid or merely ignored ones; the rest are refusals
    assert sent[-1][1] == 409 and "Idempotency-Key" in sent[-1][2]
    assert {code for _, code, _ in sent} >= {400, 401, 404, 409, 413}
    for _path, _code, text in sent:
        assert "SELECT" not in text and "INSERT" not in text and "[parameters" not in text, text

    # Still serving valid requests, token-exactly, and the session's turns are dense.
    turns = proxy_f.store.turns.read(session_id=s.session_id, with_experts=False)
    assert [t.turn_index for t in turns] == list(range(len(turns)))
    with httpx.Client(base_url=s.base_url, timeout=30) as http:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "What is in /tmp?"}]
        tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object",
                  "properties": {"path": {"type": "string"}}}}}]  # fmt: skip
        first = http.post("/chat/completions", json={"model": "m", "messages": msgs, "tools": tools}).json()
        msg = first["choices"][0]["message"]
        msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a.txt"}]
        second = http.post("/chat/completions", json={"model": "m", "messages": msgs, "tools": tools})
        assert second.status_code == 200
    after = proxy_f.store.turns.read(session_id=s.session_id, with_experts=False)
    assert [t.turn_index for t in after] == list(range(len(after)))
    assert after[-1].route == "append" and after[-1].segment_index == after[-2].segment_index
