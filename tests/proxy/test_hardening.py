"""Findings of the attack run, each pinned: what a failing engine, a leaving client, a missing cap and
debug logging may no longer do."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from dressage.config import Settings
from dressage.proxy import ProxyServer
from dressage.redact import install_log_redaction
from dressage.store import EventStore
from tests.loopback import ThreadedServer
from tests.proxy.conftest import Harness, LoopThread
from tests.scripted_engine import ScriptedEngine

MSGS = [{"role": "user", "content": "Tell me a long story."}]
LONG = "once upon a time " * 200


def _wait_turns(store: EventStore, sid: str, n: int) -> list:
    deadline = time.monotonic() + 30
    while (
        len(turns := store.turns.read(session_id=sid, with_experts=False)) < n and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return turns


@pytest.fixture
def breaking(loop_thread: LoopThread, sqlite_store: EventStore) -> Iterator[Harness]:
    with ScriptedEngine(lambda prompt, n, sampling: LONG, break_after=9).running() as eng:
        h = Harness(loop_thread, sqlite_store, eng.url)
        yield h
        loop_thread.call(h.server.stop())


@pytest.mark.parametrize(
    "path", ["/chat/completions", "/messages", "/responses", "/models/m:streamGenerateContent?alt=sse"]
)
def test_engine_failing_mid_stream_ends_the_stream_and_records_the_tokens(
    breaking: Harness, path: str
) -> None:
    """Once the engine has generated, the turn is recorded whatever fails; the stream ends properly."""
    s = breaking.session(breaking.run())
    body = {"model": "m", "stream": True, "max_tokens": 50, "messages": MSGS}
    if path == "/responses":
        body = {"model": "m", "stream": True, "max_output_tokens": 50, "input": MSGS}
    if "streamGenerateContent" in path:  # Gemini
        contents = [{"role": "user", "parts": [{"text": m["content"]}]} for m in MSGS]
        body = {"contents": contents, "generationConfig": {"maxOutputTokens": 50}}
    with httpx.Client(base_url=s.base_url, timeout=30) as http:
        r = http.post(path, json=body)
    assert r.status_code == 200
    last_events = r.text.strip().split("\n\n")[-2:]
    if path == "/chat/completions":
        assert '"engine_error"' in last_events[0] and last_events[1] == "data: [DONE]"
    elif path == "/messages":
        assert last_events[-1].startswith("event: error")
    elif "streamGenerateContent" in path:
        assert last_events[-1].startswith('data: {"error":') and '"status":"UNAVAILABLE"' in last_events[-1]
    else:
        assert last_events[-1].startswith("event: response.failed")
    turns = _wait_turns(breaking.store, s.session_id, 1)
    assert len(turns) == 1 and turns[0].generated_ids.size == 9
    assert turns[0].finish_reason == "abort" and turns[0].boundary_reason == "client_disconnected"


def test_default_cap_bounds_a_request_without_max_tokens(
    loop_thread: LoopThread, sqlite_store: EventStore
) -> None:
    with ScriptedEngine(lambda prompt, n, sampling: LONG).running() as eng:
        server = ProxyServer(sqlite_store, [eng.url], settings=Settings(default_max_tokens=7))
        loop_thread.call(server.start())
        try:
            loop_thread.call(server.create_run("cap", {}))
            s = loop_thread.call(server.open_session("cap"))
            r = httpx.post(
                f"{s.base_url}/chat/completions", json={"model": "m", "messages": MSGS}, timeout=30
            )
            assert (
                r.json()["usage"]["completion_tokens"] == 7
                and r.json()["choices"][0]["finish_reason"] == "length"
            )
        finally:
            loop_thread.call(server.stop())


def test_non_streaming_client_leaving_aborts_and_records_a_dead_end(proxy: Harness) -> None:
    """The dev engine generates slowly on a CPU: a client that gives up after 1 s stops the generation."""
    s = proxy.session(proxy.run())
    body = {
        "model": "m",
        "messages": MSGS,
        "max_tokens": 3000,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{s.base_url}/chat/completions", json=body, timeout=1.0)
    turns = _wait_turns(proxy.store, s.session_id, 1)
    assert len(turns) == 1
    dead = turns[0]
    assert dead.finish_reason == "abort" and dead.info["client_disconnected"] is True
    assert 0 < dead.generated_ids.size < 3000
    time.sleep(1.0)  # the engine was told: nothing more is generated for nobody
    assert (
        proxy.store.turns.read(session_id=s.session_id, with_experts=False)[0].generated_ids.size
        == dead.generated_ids.size
    )


def test_debug_logs_of_engine_headers_are_redacted() -> None:
    """httpx/httpcore print response headers at debug level; the handler filter redacts them."""
    app = FastAPI()

    @app.get("/model_info")
    async def info() -> JSONResponse:
        return JSONResponse({}, headers={"set-cookie": "session=sk-live-abcdefghijklmnop1234; Path=/"})

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    installed = install_log_redaction(["my-admin-secret"])
    try:
        server = ThreadedServer(app)
        server.start()
        try:
            httpx.get(f"{server.base}/model_info", headers={"x-admin": "my-admin-secret"})
        finally:
            server.stop()
    finally:
        for h, f in installed:
            h.removeFilter(f)
        root.removeHandler(handler)
        root.setLevel(old_level)
    text = buf.getvalue()
    assert "set-cookie" in text.lower()  # the headers were logged ...
    assert "sk-live-abcdefghijklmnop1234" not in text and "my-admin-secret" not in text  # ... redacted
    assert "[REDACTED]" in text
