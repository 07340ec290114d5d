"""Lineage routing end to end: tool loops append, boundaries carry reason codes, subagents get lineages."""

from __future__ import annotations

from openai import OpenAI

from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK, TOOLS, step


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
    turns = proxy.store.turns.read(run, session_id=sid)
    assert len(turns) == 30
    assert {t.segment_index for t in turns} == {0} and {t.thread_index for t in turns} == {0}
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
    # compaction that keeps the task (first user message) -> create on the main lineage
    compacted = [
        {"role": "system", "content": "Main agent."},
        {"role": "user", "content": "Hello"},
        {"role": "user", "content": "Summary so far: said hello."},
    ]
    client.chat.completions.create(model="m", messages=compacted, max_tokens=4, seed=1, extra_body=NOTHINK)
    # a rewrite that keeps only the system prompt is a new conversation -> a lineage of its own
    rewritten = [
        {"role": "system", "content": "Main agent."},
        {"role": "user", "content": "Summary: said hello."},
    ]
    client.chat.completions.create(model="m", messages=rewritten, max_tokens=4, seed=1, extra_body=NOTHINK)
    turns = proxy.store.turns.read(run, session_id=sid)
    got = [(t.route, t.boundary_reason, t.thread_index, t.segment_index) for t in turns]
    assert got[0] == ("create", None, 0, 0)
    assert got[1] == ("create", "think_stripped", 0, 1)
    assert got[2][0] == "create" and got[2][1] in ("new_context", "tools_changed") and got[2][2:] == (1, 2)
    assert got[3] == ("append", None, 1, 2)
    assert got[4][0] == "create" and got[4][1] == "template_prefix_mismatch" and got[4][2:] == (0, 3)
    assert got[5] == ("create", "new_conversation", 2, 4)


def test_subagent_sharing_the_system_prompt_gets_its_own_lineage(proxy: Harness) -> None:
    """Interleaved main agent and a subagent with the same system prompt and tools."""
    run = proxy.run()
    client, probe, sid = _clients(proxy, run)
    system = {"role": "system", "content": "You are a coding agent."}
    main = [system, {"role": "user", "content": "Fix the bug."}]
    sub = [system, {"role": "user", "content": "Subtask: find the failing test."}]
    step(client, probe, main)  # main turn 0
    step(client, probe, sub)  # the subagent starts while the main agent waits on its tool call
    step(client, probe, main)  # interleaved
    step(client, probe, sub)
    step(client, probe, main)
    turns = proxy.store.turns.read(run, session_id=sid)
    got = [(t.route, t.boundary_reason, t.thread_index, t.segment_index) for t in turns]
    assert got == [
        ("create", None, 0, 0),
        ("create", "new_conversation", 1, 1),  # not a branch of the main lineage
        ("append", None, 0, 0),
        ("append", None, 1, 1),
        ("append", None, 0, 0),
    ]
    # The anchor (last segment of lineage 0 in first-turn order) is the main agent's segment.
    root = [t.segment_index for t in turns if t.thread_index == 0]
    assert root[-1] == 0 and turns[-1].segment_index == 0
    # A regeneration of the main agent's first turn still branches from it, on its lineage.
    client.chat.completions.create(
        model="m", messages=main[:2], max_tokens=3, tools=TOOLS, extra_body=NOTHINK
    )
    last = proxy.store.turns.read(run, session_id=sid)[-1]
    assert (last.route, last.thread_index, last.parent_turn_id) == ("branch", 0, turns[0].id)
