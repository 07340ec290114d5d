"""The proxy's turn boundary (SQLite and PostgreSQL, a real proxy and a scripted engine).

A session's turn hook (what the rollout worker checkpoints its sandbox with) gets each live
request as it arrives: its turn index, dialect, body and prompt digest, and the agent's reply,
streamed or not, leaves only after the hook ended. A session started from a checkpoint
(``info["start"]``) has its first live request checked against the recorded prompt digest: equal
goes on; not equal is refused with 409 ``checkpoint_diverged`` for a fork, or only recorded for a
take-over, and a ``checkpoint_diverged`` event names both digests either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from dressage.proxy.contract import TurnRequest
from dressage.store import EventStore
from tests.proxy.conftest import Harness, LoopThread
from tests.scripted_engine import ScriptedEngine

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def proxy_s(loop_thread: LoopThread, store: EventStore) -> Iterator[Harness]:
    with ScriptedEngine(lambda prompt, n, sampling: "hello there").running() as eng:
        h = Harness(loop_thread, store, eng.url)
        yield h
        loop_thread.call(h.server.stop())


class _SlowHook:
    """Records each request; ends a moment after it started (the reply must wait for it)."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []
        self.ended = 0

    async def __call__(self, request: TurnRequest) -> None:
        self.requests.append(request)
        await asyncio.sleep(0.3)  # slower than the scripted generation: a reply not waiting shows
        self.ended += 1


def _client(h: Harness, handle: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.base_url, api_key=handle.token, max_retries=0)


def test_the_reply_waits_for_the_turn_hook(proxy_s: Harness) -> None:
    h = proxy_s
    handle = h.session(h.run())
    hook = _SlowHook()
    h.server.watch_turns(handle.session_id, hook)
    client = _client(h, handle)
    client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert hook.ended == 1
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "Again."},
    ]
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))  # type: ignore[arg-type]
    assert chunks and hook.ended == 2
    assert [(r.turn_index, r.dialect) for r in hook.requests] == [(0, "chat"), (1, "chat")]
    assert b"Again." in hook.requests[1].body and len(hook.requests[1].prompt_digest) == 64
    client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert hook.ended == 2  # a retried request is answered from the log: no boundary
    h.server.unwatch_turns(handle.session_id)
    client.chat.completions.create(model="m", messages=[*messages[:2], {"role": "user", "content": "3"}])  # type: ignore[arg-type]
    assert hook.ended == 2


def _started(h: Harness, run: str, digest: str, on_diverge: str) -> Any:
    start = {
        "path": "checkpoint",
        "turn": 0,
        "prompt_digest": digest,
        "from": "test",
        "on_diverge": on_diverge,
    }
    return h.loop.call(h.server.open_session(run, task_id=None, agent="test", info={"start": start}))


def test_first_request_of_a_checkpoint_start_is_checked(proxy_s: Harness, store: EventStore) -> None:
    h = proxy_s
    run = h.run()
    first = h.session(run)
    hook = _SlowHook()
    h.server.watch_turns(first.session_id, hook)
    _client(h, first).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    digest = hook.requests[0].prompt_digest

    same = _started(h, run, digest, "refuse")
    _client(h, same).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert len(store.turns.read(session_id=same.session_id)) == 1

    other = _started(h, run, digest, "refuse")
    with pytest.raises(openai.ConflictError, match="checkpoint diverged"):
        _client(h, other).chat.completions.create(model="m", messages=[{"role": "user", "content": "No."}])  # type: ignore[arg-type]
    assert store.turns.read(session_id=other.session_id) == []

    taken = _started(h, run, digest, "record")
    _client(h, taken).chat.completions.create(model="m", messages=[{"role": "user", "content": "No."}])  # type: ignore[arg-type]
    assert len(store.turns.read(session_id=taken.session_id)) == 1

    events = store.events.read(run, kinds=("checkpoint_diverged",))
    assert sorted(e.session_id for e in events) == sorted([other.session_id, taken.session_id])
    assert {e.payload["expected_digest"] for e in events} == {digest}
    assert all(e.payload["got_digest"] != digest for e in events)
