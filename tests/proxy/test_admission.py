"""Admission control on a real proxy on loopback (:mod:`dressage.proxy.admission`).

The proxy's slots are taken by the test itself through the proxy's own gate (standing in for turns
the proxy is busy with), so which request queues and which is refused does not depend on timing.
Refused requests get HTTP 503 + ``Retry-After`` in their dialect and record nothing; queued ones
are served, token-exact, once a slot frees; a refused request retried later succeeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openai import OpenAI

from dressage.config import Settings
from dressage.proxy import ProxyServer
from dressage.proxy.admission import AdmissionGate
from dressage.store import EventStore
from tests.dev_engine import RunningEngine
from tests.proxy.conftest import ADMIN, LoopThread

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 5,
    "seed": 1,
    "logprobs": True,
}
MESSAGES = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}

Start = Callable[..., ProxyServer]


@pytest.fixture
def start(loop_thread: LoopThread, sqlite_store: EventStore, engine: RunningEngine) -> Iterator[Start]:
    """Starts proxies with the given admission settings (stopped after the test)."""
    servers: list[ProxyServer] = []

    def make(**admission: Any) -> ProxyServer:
        settings = Settings(admin_token=ADMIN, **admission)
        server = ProxyServer(sqlite_store, [engine.url], settings=settings, context_window=4096)
        loop_thread.call(server.start())
        loop_thread.call(server.create_run("r", {}))
        servers.append(server)
        return server

    yield make
    for server in servers:
        loop_thread.call(server.stop())


def _hold(loop_thread: LoopThread, gate: AdmissionGate) -> None:
    """Take a slot, as a turn the proxy is working on would."""
    loop_thread.call(gate.enter())


def _release(loop_thread: LoopThread, gate: AdmissionGate) -> None:
    loop_thread.loop.call_soon_threadsafe(gate.leave)


def _wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, "condition not reached in 30 s"
        time.sleep(0.01)


def _chat(server: ProxyServer, token: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/s/{token}/v1/chat/completions", json=CHAT, timeout=60)


def _assert_token_exact(store: EventStore, session_id: str, r: httpx.Response) -> None:
    (turn,) = store.turns.read(session_id=session_id, with_experts=False)
    body = r.json()
    assert r.headers["x-dressage-turn-id"] == turn.id
    assert body["usage"]["completion_tokens"] == turn.generated_ids.size
    received = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert received == pytest.approx(turn.logprobs.tolist(), abs=1e-6)


def test_past_the_queue_requests_are_refused_in_their_dialect_and_recorded_nowhere(
    start: Start, loop_thread: LoopThread, sqlite_store: EventStore
) -> None:
    server = start(proxy_max_active=1, proxy_max_queue=1, proxy_queue_timeout_s=120, proxy_retry_after_s=2)
    gate = server.admission
    queued_s, chat_s, messages_s = (loop_thread.call(server.open_session("r")) for _ in range(3))
    _hold(loop_thread, gate)
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(_chat, server, queued_s.token)
        _wait_for(lambda: gate.waiting == 1)

        refused = _chat(server, chat_s.token)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        error = refused.json()["error"]
        assert error["code"] == "overloaded" and error["type"] == "api_error", error
        assert "retry after 2 s" in error["message"]

        anthropic = httpx.post(
            f"{server.base_url}/v1/messages",
            json=MESSAGES,
            headers={"x-api-key": messages_s.token},
            timeout=60,
        )
        assert anthropic.status_code == 503 and anthropic.headers["retry-after"] == "2"
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "overloaded_error"

        for s in (chat_s, messages_s):
            assert sqlite_store.turns.read(session_id=s.session_id, with_experts=False) == []
        assert not queued.done()  # still waiting for the slot the test holds
        _release(loop_thread, gate)
        served = queued.result(timeout=60)
    assert served.status_code == 200, served.text
    _assert_token_exact(sqlite_store, queued_s.session_id, served)

    retried = _chat(server, chat_s.token)  # the refused request, retried once the proxy has room
    assert retried.status_code == 200, retried.text
    _assert_token_exact(sqlite_store, chat_s.session_id, retried)
    assert gate.active == 0 and gate.waiting == 0
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert 'dressage_proxy_admission_refused_total{reason="queue_full"} 2.0' in metrics
    assert 'dressage_proxy_errors_total{code="overloaded",status="503"} 2.0' in metrics


def test_a_request_waiting_past_the_queue_timeout_is_refused(
    start: Start, loop_thread: LoopThread, sqlite_store: EventStore
) -> None:
    server = start(proxy_max_active=1, proxy_max_queue=8, proxy_queue_timeout_s=0.2, proxy_retry_after_s=1)
    gate = server.admission
    s = loop_thread.call(server.open_session("r"))
    _hold(loop_thread, gate)
    refused = _chat(server, s.token)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "waited too long" in refused.json()["error"]["message"]
    assert gate.waiting == 0 and sqlite_store.turns.read(session_id=s.session_id, with_experts=False) == []
    assert 'reason="queue_timeout"} 1.0' in httpx.get(f"{server.base_url}/metrics").text
    _release(loop_thread, gate)
    _wait_for(lambda: gate.active == 0)
    served = _chat(server, s.token)
    assert served.status_code == 200, served.text
    _assert_token_exact(sqlite_store, s.session_id, served)


def test_the_openai_sdk_retries_a_refusal_after_retry_after(start: Start, loop_thread: LoopThread) -> None:
    """The official SDK treats 503 as retryable and waits ``Retry-After``: the agent never sees the refusal."""
    server = start(proxy_max_active=1, proxy_max_queue=0, proxy_retry_after_s=1)
    gate = server.admission
    s = loop_thread.call(server.open_session("r"))
    _hold(loop_thread, gate)
    registry = server.metrics.registry

    def refusals() -> float:
        return (
            registry.get_sample_value("dressage_proxy_admission_refused_total", {"reason": "queue_full"}) or 0
        )

    def release_after_first_refusal() -> None:
        _wait_for(lambda: refusals() >= 1)
        _release(loop_thread, gate)

    releaser = threading.Thread(target=release_after_first_refusal)
    releaser.start()
    r = OpenAI(base_url=s.base_url, api_key="x", max_retries=3).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, seed=1
    )
    releaser.join()
    assert r.choices[0].message is not None
    assert refusals() >= 1 and gate.active == 0


def test_every_path_gives_its_slot_back(start: Start, loop_thread: LoopThread) -> None:
    """Streamed, retried (answered from the log), abandoned and failed requests leave the gate empty.

    With one slot and no queue, a slot that leaked would refuse every later request.
    """
    server = start(proxy_max_active=1, proxy_max_queue=0)
    gate = server.admission
    s = loop_thread.call(server.open_session("r"))
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(**CHAT, stream=True))
    assert chunks
    assert _chat(server, s.token).status_code == 200
    assert _chat(server, s.token).headers["x-dressage-replayed"] == "1"  # the retry, from the log
    long = {**CHAT, "messages": [{"role": "user", "content": "Count"}], "max_tokens": 3000}
    with pytest.raises(httpx.ReadTimeout):  # the client leaves mid-generation
        httpx.post(f"{s.base_url}/chat/completions", json=long, timeout=1.0)
    bad = httpx.post(f"{s.base_url}/chat/completions", json={**CHAT, "max_tokens": -1}, timeout=60)
    assert bad.status_code == 400
    _wait_for(lambda: gate.active == 0 and gate.waiting == 0)
    assert _chat(server, loop_thread.call(server.open_session("r")).token).status_code == 200
