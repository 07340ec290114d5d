"""Replay of a resumed session through a real proxy and a scripted engine, on SQLite and PostgreSQL.

A session is interrupted after some turns and taken over by a new attempt (``take_over_session``: new
token, same turns). The new agent's requests that match recorded turns are answered from the log
(no engine request, no new turn row), the rest of the run is live on the same session, and the
trajectory equals an uninterrupted one token for token. An agent that behaves differently after
the takeover ends the replay: its turn opens a ``replay_diverged`` segment and goes on live.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from dressage.store import EventStore
from dressage.training.materialize import anchor_position, build_segments
from tests.proxy.conftest import Harness, LoopThread
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

STEPS = 3
TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def coder(prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
    """A tool call per step (the step is the number of tool results so far), then an answer."""
    step = prompt.count("<tool_response>")
    if step < STEPS:
        return qwen_tool_call("run", cmd=f"make step{step}")
    return "All steps ran."


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    with ScriptedEngine(coder).running() as eng:
        yield eng


@pytest.fixture
def proxy_r(loop_thread: LoopThread, store: EventStore, scripted: ScriptedEngine) -> Iterator[Harness]:
    h = Harness(loop_thread, store, scripted.url)
    yield h
    loop_thread.call(h.server.stop())


def agent(
    h: Harness,
    token: str,
    *,
    max_requests: int = 99,
    tool_output: Any = lambda step: f"ok {step}",
    seed: Any = lambda i: 7,
    on_request: Any = None,
    system: str = "You are a coding agent.",
) -> list[str]:
    """A whitebox tool loop; returns the ``x-dressage-replayed`` header of each request ('' if live)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Run the three steps."},
    ]
    replayed: list[str] = []
    for i in range(max_requests):
        if on_request is not None:
            on_request(i)
        client = OpenAI(base_url=f"{h.server.base_url}/s/{token}/v1", api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=messages, tools=[TOOL], max_tokens=64, seed=seed(i),  # type: ignore[arg-type]
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )  # fmt: skip
        replayed.append(raw.headers.get("x-dressage-replayed", ""))
        msg = raw.parse().choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_output(i)})
    return replayed


def _tokens(store: EventStore, sid: str) -> list[tuple[Any, ...]]:
    out = []
    for t in store.turns.read(session_id=sid, with_experts=False):
        arrays = (t.context_ids, t.generated_ids, t.logprobs, t.policy_versions)
        head = (t.turn_index, t.segment_index, t.segment_offset, t.route, t.thread_index)
        out.append((*head, *(a.tolist() for a in arrays)))
    return out


def _resume(h: Harness, sid: str, attempt: int = 2) -> Any:
    return h.loop.call(h.server.take_over_session(sid, attempt=attempt))


def test_resumed_session_replays_recorded_turns_then_goes_live(
    proxy_r: Harness, scripted: ScriptedEngine
) -> None:
    h, store = proxy_r, proxy_r.store
    run = h.run()
    ref = h.session(run)
    assert agent(h, ref.token) == [""] * (STEPS + 1)
    reference = _tokens(store, ref.session_id)

    crashed = h.session(run)
    agent(h, crashed.token, max_requests=2)  # the worker dies after two turns
    assert len(_tokens(store, crashed.session_id)) == 2
    calls_before = len(scripted.prompts)

    resumed = _resume(h, crashed.session_id)
    with pytest.raises(AuthenticationError):  # the dead attempt's token stops working
        OpenAI(base_url=crashed.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )

    def restart_mid_replay(i: int) -> None:
        if i == 1:
            h.restart()  # the replay is rebuilt from the log

    # After the restart the agent sends another seed: the body differs, the prompt ids match.
    headers = agent(h, resumed.token, on_request=restart_mid_replay, seed=lambda i: 7 + i)
    assert headers == ["resume", "resume", "", ""]
    assert len(scripted.prompts) - calls_before == 2  # only the turns past the recorded ones
    assert _tokens(store, crashed.session_id) == reference  # token-exact, one dense segment

    turns = store.turns.read(session_id=crashed.session_id, with_experts=False)
    assert turns[2].info["replay"]["outcome"] == "completed"
    assert turns[2].info["replay"]["turns_replayed"] == 1  # the restarted proxy replayed one more
    assert turns[2].boundary_reason is None
    h.loop.call(h.server.finalize_session(crashed.session_id, "finished", reward=1.0, attempt=2))
    session = store.sessions.get(crashed.session_id)
    assert session.attempt == 2 and session.info["resume"]["from_attempt"] == 1
    resumed_events = store.events.read(run, kinds=("session_resumed",))
    assert [(e.session_id, e.payload["next_turn"]) for e in resumed_events] == [(crashed.session_id, 2)]


def test_agent_that_diverges_after_resume_goes_live_on_a_replay_diverged_segment(
    proxy_r: Harness, scripted: ScriptedEngine
) -> None:
    h, store = proxy_r, proxy_r.store
    run = h.run()
    s = h.session(run)
    agent(h, s.token, max_requests=3)  # three turns recorded, then the worker dies
    calls_before = len(scripted.prompts)
    resumed = _resume(h, s.session_id)

    # The first tool now prints something else: turn 1's prompt differs from the recorded one.
    headers = agent(h, resumed.token, tool_output=lambda step: f"changed {step}")
    assert headers == ["resume", "", "", ""]
    assert len(scripted.prompts) - calls_before == 3
    turns = store.turns.read(session_id=s.session_id, with_experts=False)
    assert [t.turn_index for t in turns] == list(range(6))  # dense: nothing replayed was written again
    live = turns[3]
    assert live.boundary_reason == "replay_diverged" and live.route == "branch"
    assert live.segment_index == 1 and live.thread_index == 0
    assert live.info["replay"] == {
        "outcome": "diverged", "turns_replayed": 1, "tokens_replayed": turns[0].generated_ids.size,
        "targets": 3, "from_turn": 3, "live_turn": 3,
    }  # fmt: skip
    assert [t.route for t in turns[4:]] == ["append", "append"]  # then live on the new segment

    # The trainer sees one trajectory whose anchor is the live continuation.
    h.loop.call(h.server.finalize_session(s.session_id, "finished", reward=1.0))
    segments = build_segments(turns)
    anchor = anchor_position(segments)
    assert anchor is not None and segments[anchor].segment_index == 1
    assert store.sessions.get(s.session_id).info["replay"]["outcome"] == "diverged"


def test_agent_that_diverges_at_its_first_request_takes_the_root_over(
    proxy_r: Harness, scripted: ScriptedEngine
) -> None:
    h, store = proxy_r, proxy_r.store
    run = h.run()
    s = h.session(run)
    agent(h, s.token, max_requests=2)
    resumed = _resume(h, s.session_id)
    # A system prompt that changed (a CLI that writes the time into it): nothing can be replayed.
    headers = agent(h, resumed.token, system="You are a coding agent. It is 10:02.")
    assert headers == [""] * (STEPS + 1)
    turns = store.turns.read(session_id=s.session_id, with_experts=False)
    live = turns[2]
    assert (live.route, live.thread_index, live.boundary_reason) == ("create", 1, "replay_diverged")
    assert live.info["replay"]["turns_replayed"] == 0 and live.info["replay"]["outcome"] == "diverged"
    segments = build_segments(turns)
    anchor = anchor_position(segments)  # the live run, not the dead attempt's two turns
    assert anchor is not None and segments[anchor].thread_index == 1
    assert segments[anchor].last_turn_index == len(turns) - 1


def test_resume_is_refused_for_a_finished_session_and_an_older_attempt(proxy_r: Harness) -> None:
    h = proxy_r
    run = h.run()
    s = h.session(run)
    _resume(h, s.session_id, attempt=3)
    from dressage.errors import LeaseError

    with pytest.raises(LeaseError, match="attempt 2 cannot resume"):
        _resume(h, s.session_id, attempt=2)
    with pytest.raises(LeaseError, match="taken over by attempt 3"):
        h.loop.call(h.server.finalize_session(s.session_id, "finished", reward=0.0, attempt=1))
    h.loop.call(h.server.finalize_session(s.session_id, "finished", reward=0.0, attempt=3))
    with pytest.raises(LeaseError, match="is finished"):
        _resume(h, s.session_id, attempt=4)
    # A session without turns has nothing to replay: the new attempt's first request is live.
    fresh = h.session(run)
    again = _resume(h, fresh.session_id)
    r = httpx.post(
        f"{again.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=30,
    )
    assert r.status_code == 200 and "x-dressage-replayed" not in r.headers
