"""A fork's first turns through a real proxy and a scripted engine, on SQLite and PostgreSQL.

A fork is opened through the admin API with ``parent_session_id`` and ``fork_turn`` K; its agent's
first K requests are answered with the parent's turns, copied into the fork id for id (no engine
request), and the rest is live. A request that does not replay is refused (409 ``fork_diverged``),
recorded as an event, and nothing live is mixed into the shared turns. Forks of forks, and forks
of a failed session at its last turn, work the same; a fork's ``info["sampling_seed"]`` seeds the
requests that name none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import ConflictError

from dressage.store import EventStore
from tests.proxy.conftest import ADMIN, Harness, LoopThread
from tests.proxy.test_replay import STEPS, agent, coder
from tests.scripted_engine import ScriptedEngine


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    with ScriptedEngine(coder).running() as eng:
        yield eng


@pytest.fixture
def proxy_f(loop_thread: LoopThread, store: EventStore, scripted: ScriptedEngine) -> Iterator[Harness]:
    h = Harness(loop_thread, store, scripted.url)
    yield h
    loop_thread.call(h.server.stop())


def _open(h: Harness, run: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{h.server.base_url}/admin/sessions",
        json={"run": run, **body},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )


def _fork(h: Harness, run: str, parent: str, k: int, **body: Any) -> dict[str, Any]:
    r = _open(h, run, parent_session_id=parent, fork_turn=k, **body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _rows(store: EventStore, sid: str) -> list[tuple[Any, ...]]:
    out = []
    for t in store.turns.read(session_id=sid):
        head = (t.turn_index, t.segment_index, t.segment_offset, t.route, t.thread_index, t.boundary_reason)
        arrays = (t.context_ids, t.generated_ids, t.logprobs, t.loss_mask, t.policy_versions)
        out.append((*head, t.finish_reason, *(a.tolist() for a in arrays)))
    return out


def test_fork_copies_the_parents_turns_then_goes_live(proxy_f: Harness, scripted: ScriptedEngine) -> None:
    h, store = proxy_f, proxy_f.store
    run = h.run()
    parent = h.session(run)
    assert agent(h, parent.token) == [""] * (STEPS + 1)
    before = len(scripted.prompts)

    child = _fork(h, run, parent.session_id, 2)
    # The child's agent sends other seeds (other bodies): the prompts match, the turns are copied.
    assert agent(h, child["token"], seed=lambda i: 1000 + i) == ["fork", "fork", "", ""]
    assert len(scripted.prompts) - before == 2  # the engine saw only the live turns
    assert [s.get("sampling_seed") for s in scripted.sampling[before:]] == [1002, 1003]
    rows, parent_rows = _rows(store, child["session_id"]), _rows(store, parent.session_id)
    assert rows[:2] == parent_rows[:2] and len(rows) == STEPS + 1
    turns = store.turns.read(session_id=child["session_id"])
    ptruns = store.turns.read(session_id=parent.session_id)
    assert [t.info.get("replayed_from") for t in turns] == [ptruns[0].id, ptruns[1].id, None, None]
    assert turns[1].parent_turn_id == turns[0].id  # the copy points at the child's own turn
    assert store.sessions.get(child["session_id"]).fork_turn == 2

    grandchild = _fork(h, run, child["session_id"], 3)  # a fork of a fork shares the child's turns
    before = len(scripted.prompts)
    assert agent(h, grandchild["token"], seed=lambda i: 2000 + i) == ["fork", "fork", "fork", ""]
    assert len(scripted.prompts) - before == 1
    assert _rows(store, grandchild["session_id"])[:3] == rows[:3]
    info = [t.info["replayed_from"] for t in store.turns.read(session_id=grandchild["session_id"])[:3]]
    assert info == [t.id for t in turns[:3]]


def test_a_fork_that_does_not_replay_is_refused_and_says_where(
    proxy_f: Harness, scripted: ScriptedEngine
) -> None:
    h, store = proxy_f, proxy_f.store
    run = h.run()
    parent = h.session(run)
    agent(h, parent.token)
    child = _fork(h, run, parent.session_id, 3)
    before = len(scripted.prompts)
    with pytest.raises(ConflictError, match="fork diverged at turn 2"):  # the tool printed something else
        agent(h, child["token"], tool_output=lambda step: "changed" if step == 1 else f"ok {step}")
    assert len(scripted.prompts) == before
    assert len(store.turns.read(session_id=child["session_id"])) == 2  # the copies before the divergence
    (event,) = [e for e in store.events.read(run, kinds=("fork_diverged",))]
    assert (event.session_id, event.payload["turn_index"], event.payload["fork_turn"]) == (
        child["session_id"], 2, 3,
    )  # fmt: skip
    # The record says where the prompts part: the parent's tool output against the fork's.
    error = event.payload["error"]
    assert "first at prompt token" in error, error
    recorded, request = error.split(": recorded '")[1].split("', request '")
    assert "ok 1" in recorded and "changed" not in recorded, error
    assert "changed" in request and "ok 1" not in request, error


def test_fork_of_a_failed_session_resamples_its_last_turn(proxy_f: Harness, scripted: ScriptedEngine) -> None:
    h, store = proxy_f, proxy_f.store
    run = h.run()
    parent = h.session(run)
    agent(h, parent.token, max_requests=2)
    h.loop.call(h.server.finalize_session(parent.session_id, "failed", finish_reason="agent_crashed"))
    child = _fork(h, run, parent.session_id, 2, info={"sampling_seed": 77})
    before = len(scripted.prompts)
    assert agent(h, child["token"], seed=lambda i: None) == ["fork", "fork", "", ""]
    assert [s.get("sampling_seed") for s in scripted.sampling[before:]] == [77, 77]  # the session's seed
    assert _rows(store, child["session_id"])[:2] == _rows(store, parent.session_id)


def test_a_fork_past_the_parents_turns_is_refused(proxy_f: Harness) -> None:
    h = proxy_f
    run = h.run()
    parent = h.session(run)
    agent(h, parent.token, max_requests=1)
    r = _open(h, run, parent_session_id=parent.session_id, fork_turn=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "fork_turn", r.text
    r = _open(h, run, parent_session_id=parent.session_id)
    assert r.status_code == 400 and "both parent_session_id and fork_turn" in r.text
    r = _open(h, run, parent_session_id="nope", fork_turn=0)
    assert r.status_code in (400, 404) and "nope" in r.text


def test_a_fork_under_a_newer_policy_keeps_both_versions(proxy_f: Harness, scripted: ScriptedEngine) -> None:
    h, store = proxy_f, proxy_f.store
    run = h.run()
    parent = h.session(run)
    agent(h, parent.token)
    scripted.weight_version = "1"  # the weights moved on after the parent was recorded
    child = _fork(h, run, parent.session_id, 2)
    agent(h, child["token"])
    turns = store.turns.read(session_id=child["session_id"])
    assert [sorted(set(t.policy_versions.tolist())) for t in turns] == [[0], [0], [1], [1]]
