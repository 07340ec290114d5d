"""A turn whose durable append fails leaves the session's in-memory state as it was.

The proxy changes a session's state (segment index, segments, lineages, counters, replies) only
once the turn is in the log. Here the append is refused because the session ended behind this
proxy's back while the turn was generating (another proxy or a reclaiming worker finalized it):
the client gets a clean 401, the cached state is unchanged, and the next turn is refused cleanly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from dressage.proxy.sessions import SessionState
from tests.proxy.conftest import Harness

MSGS = [{"role": "user", "content": "Count."}]


def _snapshot(state: SessionState) -> dict[str, Any]:
    """Everything recording may change in a session's state, as plain values."""
    return {
        "next_turn": state.next_turn,
        "next_segment": state.next_segment,
        "next_thread": state.next_thread,
        "thread_by_context": dict(state.thread_by_context),
        "segments": {k: (v.index, v.thread_index, v.length) for k, v in state.segments.items()},
        "index": {
            k: (list(v.ids), v.text, list(v.turn_ids), len(v.anchors))
            for k, v in state.index.segments.items()
        },
        "replies": sorted(state.replies),
        "by_fingerprint": dict(state.by_fingerprint),
        "responses": sorted(state.responses),
        "finished": state.finished,
    }


def _chat(base_url: str, token: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{base_url}/chat/completions",
        json={"model": "m", "messages": messages, "max_tokens": 8, "seed": 1},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def test_a_refused_append_leaves_the_session_state_unchanged(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    first = _chat(s.base_url, s.token, MSGS)
    assert first.status_code == 200
    state = proxy.server.registry.cached(s.session_id)
    assert state is not None and state.next_turn == 1
    before = _snapshot(state)

    # The second turn is held at the engine (paused) while the session ends in the log.
    proxy.loop.call(proxy.server.pause())
    got: list[httpx.Response] = []
    follow_up = [*MSGS, {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}]
    follow_up.append({"role": "user", "content": "Again."})
    sender = threading.Thread(target=lambda: got.append(_chat(s.base_url, s.token, follow_up)))
    sender.start()
    deadline = time.monotonic() + 60
    while not state.inflight:  # authenticated, planned and registered: it waits for the paused engine
        assert sender.is_alive() and time.monotonic() < deadline, f"the turn was not held: {got}"
        time.sleep(0.01)
    proxy.store.sessions.finalize(s.session_id, "failed", error="taken by another worker")
    proxy.loop.call(proxy.server.continue_generation(None))
    sender.join(timeout=60)

    assert got and got[0].status_code == 401
    assert "nothing was recorded" in got[0].json()["error"]["message"]
    assert proxy.server.registry.cached(s.session_id) is state  # not evicted: nothing to undo
    assert _snapshot(state) == before
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 1

    # The next turn is refused cleanly (the session is over), and records nothing either.
    again = _chat(s.base_url, s.token, follow_up)
    assert again.status_code == 401
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 1
