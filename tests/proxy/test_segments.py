"""Lineage routing end to end: tool loops append, boundaries carry reason codes, subagents get lineages."""

from __future__ import annotations

from openai import OpenAI

from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK, step


def _clients(proxy: Harness, run: str) -> tuple[OpenAI, OpenAI, str]:
    main = proxy.session(run)
    probe = proxy.session(run)
    return (
        OpenAI(base_url=main.base_url, api_key="x"),
        OpenAI(base_url=probe.base_url, api_key="x"),
        main.session_id,
    )


def test_thirty_turn_tool_loop_keeps_one_segment(proxy: Harness) -> None:
    run = proxy.run()
    client, probe, sid = _clients(proxy, run)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List files."}]
    for _ in range(30):
        step(client, probe, messages)
    turns = proxy.store.read_turns(run, session_id=sid)
    assert len(turns) == 30
    assert {t.segment_index for t in turns} == {0} and {t.lineage_index for t in turns} == {0}
    assert [t.route for t in turns] == ["create"] + ["append"] * 29
    offsets = [t.segment_offset for t in turns]
    for prev, cur, off in zip(turns, turns[1:], offsets[1:], strict=False):
        assert off == prev.segment_offset + prev.context_ids.size + prev.generated_ids.size
        assert cur.parent_turn_id == prev.id


def test_new_user_turn_compaction_and_subagent_boundaries(proxy: Harness) -> None:
    run = proxy.run()
    client, probe, sid = _clients(proxy, run)
    # thinking on: a new user query strips the earlier <think> block -> create, think_stripped
    msgs = [{"role": "system", "content": "Main agent."}, {"role": "user", "content": "Hello"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=4, seed=1)
    m = r.choices[0].message
    msgs += [
        {
            "role": "assistant",
            "content": m.content or "",
            "reasoning_content": m.model_extra.get("reasoning_content"),
        },
        {"role": "user", "content": "And now?"},
    ]
    client.chat.completions.create(model="m", messages=msgs, max_tokens=4, seed=1)
    # an interleaved subagent (its own system prompt): its own lineage, and its tool loop appends
    sub = [{"role": "system", "content": "You are a subagent."}, {"role": "user", "content": "Search."}]
    step(client, probe, sub)
    step(client, probe, sub)
    # compaction: the main agent's history replaced by a summary -> create on the main lineage
    compacted = [
        {"role": "system", "content": "Main agent."},
        {"role": "user", "content": "Summary: said hello."},
    ]
    client.chat.completions.create(model="m", messages=compacted, max_tokens=4, seed=1, extra_body=NOTHINK)
    turns = proxy.store.read_turns(run, session_id=sid)
    got = [(t.route, t.boundary_reason, t.lineage_index, t.segment_index) for t in turns]
    assert got[0] == ("create", None, 0, 0)
    assert got[1] == ("create", "think_stripped", 0, 1)
    assert got[2][0] == "create" and got[2][1] in ("new_context", "tools_changed") and got[2][2:] == (1, 2)
    assert got[3] == ("append", None, 1, 2)
    assert got[4][0] == "create" and got[4][1] is not None and got[4][2] == 0 and got[4][3] == 3
