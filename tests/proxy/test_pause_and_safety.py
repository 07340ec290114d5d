"""Pause/resume for weight updates during a stream; refusals (4xx, never 500) that leave the log unchanged."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.proxy.conftest import ADMIN, Harness

MSGS = [{"role": "user", "content": "Count."}]


def test_pause_resume_during_streaming_switches_versions(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x")
    stream = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=40, seed=5, logprobs=True, stream=True
    )
    received: list[float] = []
    paused_at = None
    held: list[int] = []  # tokens the client had when generation was continued
    for c in stream:
        if c.choices and c.choices[0].logprobs:
            received.extend(e.logprob for e in c.choices[0].logprobs.content)
        if paused_at is None and len(received) >= 5:
            proxy.loop.call(proxy.server.pause())
            paused_at = len(received)
            httpx.post(
                f"{proxy.engine_url}/update_weight_version",
                json={"new_version": "1", "abort_all_requests": False},
            )

            def resume() -> None:
                time.sleep(0.3)
                held.append(len(received))
                proxy.loop.call(proxy.server.continue_generation(1))

            threading.Thread(target=resume).start()
    turn = proxy.store.turns.read(run, session_id=s.session_id)[0]
    assert turn.generated_ids.size == len(received) == 40  # nothing lost or duplicated
    assert turn.logprobs.tolist() == pytest.approx(received, abs=1e-6)
    versions = turn.policy_versions.tolist()
    switch = versions.index(1)
    assert set(versions[:switch]) == {0} and set(versions[switch:]) == {1}
    # The pause landed after the client's 5th token (tokens already in flight still arrive, as many as
    # the engine was ahead: a loaded machine makes that more than one or two) and held generation: no
    # version-1 token reached the client before generation was continued.
    assert paused_at <= switch < 40 and held and held[0] <= switch, (paused_at, switch, held)
    assert turn.info.get("resumes") == 1
    httpx.post(
        f"{proxy.engine_url}/update_weight_version", json={"new_version": "0", "abort_all_requests": False}
    )


def _post(
    proxy: Harness, path: str, body: Any = None, *, token: str | None = None, raw: bytes | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if raw is not None:
        return httpx.post(
            f"{proxy.server.base_url}{path}",
            content=raw,
            headers={**headers, "Content-Type": "application/json"},
        )
    return httpx.post(f"{proxy.server.base_url}{path}", json=body, headers=headers)


BAD_BODIES: list[tuple[Any, str | None]] = [
    ({"messages": MSGS, "logit_bias": {"1": 5}}, "unsupported_parameter"),
    ({"messages": MSGS, "tool_choice": "required"}, "invalid_value"),  # required without tools
    (
        {
            "messages": MSGS,
            "tool_choice": {"type": "function", "function": {"name": "g"}},
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "invalid_value",  # a named function that is not among the tools
    ),
    ({"messages": MSGS, "tool_choice": "sometimes"}, "invalid_value"),
    ({"messages": MSGS, "audio": {"voice": "x"}}, "unsupported_parameter"),
    ({"messages": []}, "invalid_type"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_value"),
    ({"messages": MSGS, "temperature": "hot"}, "invalid_type"),
    ({"messages": MSGS, "max_tokens": -1}, "invalid_value"),
    ({"messages": MSGS, "tools": [{"type": "function"}]}, "invalid_value"),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "x",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}],
                },
                *MSGS,
            ]
        },
        "invalid_messages",
    ),
    ({"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 1}, "context_length_exceeded"),
]


def test_bad_requests_get_openai_4xx_and_leave_the_log_unchanged(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    other = proxy.session(run)
    before = proxy.store.events.last_position(run)
    url = "/v1/chat/completions"
    for body, code in BAD_BODIES:
        r = _post(proxy, url, body, token=s.token)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == code and err["message"] and "type" in err and "param" in err
    assert _post(proxy, url, raw=b"{not json", token=s.token).json()["error"]["code"] == "invalid_json"
    too_big = _post(proxy, url, raw=b'{"messages": "' + b"x" * 300_000 + b'"}', token=s.token)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
    assert _post(proxy, url, {"messages": MSGS}, token="sk-wrong-token").status_code == 401
    assert _post(proxy, url, {"messages": MSGS}).status_code == 401
    assert (
        _post(proxy, "/s/sk-nope/v1/chat/completions", {"messages": MSGS}, token=other.token).status_code
        == 401
    )
    assert httpx.get(f"{proxy.server.base_url}/v1/nothing").status_code == 404
    events = proxy.store.events.read(run, after=before)
    assert [e.kind for e in events] == ["context_overflow"]  # the one refusal that is recorded
    assert proxy.store.turns.read(run) == []
    # a finished session's token is refused, with the official client too
    proxy.loop.call(proxy.server.finalize_session(s.session_id, "finished", reward=1.0))
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=s.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=MSGS
        )
    assert proxy.store.turns.read(run) == []
    metrics = httpx.get(f"{proxy.server.base_url}/metrics").text
    assert "dressage_proxy_errors_total" in metrics and "sk-" not in metrics


def test_admin_api_and_secrets(proxy: Harness) -> None:
    base = proxy.server.base_url
    assert httpx.post(f"{base}/admin/runs", json={"name": "x"}).status_code == 401
    auth = {"Authorization": f"Bearer {ADMIN}"}
    run = httpx.post(
        f"{base}/admin/runs", json={"name": "admin-run", "config": {"a": 1}}, headers=auth
    ).json()
    assert run["name"] == "admin-run"
    sess = httpx.post(f"{base}/admin/sessions", json={"run": "admin-run", "agent": "a"}, headers=auth).json()
    assert sess["base_url"].endswith(f"/s/{sess['token']}/v1")
    r = OpenAI(base_url=sess["base_url"], api_key="x").chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "my key is sk-abcdefghijklmnop1234 and sup3r-secret-value"}],
        max_tokens=2,
    )
    assert r.choices[0].finish_reason == "length"
    fin = {"status": "finished", "reward": 0.5}
    for _ in range(2):  # idempotent
        got = httpx.post(f"{base}/admin/sessions/{sess['session_id']}/finalize", json=fin, headers=auth)
        assert got.status_code == 200 and got.json()["status"] == "finished"
    assert httpx.post(f"{base}/admin/pause", headers=auth).json() == {"paused": True}
    assert httpx.get(f"{base}/health").json()["paused"] is True
    assert httpx.post(f"{base}/admin/resume", json={"version": 3}, headers=auth).json()["paused"] is False
    turns = proxy.store.turns.read("admin-run")
    stored = repr([(t.info, t.sampling_params) for t in turns])
    assert (
        "sup3r-secret-value" not in stored
        and "sk-abcdefghijklmnop1234" not in stored
        and sess["token"] not in stored
    )
