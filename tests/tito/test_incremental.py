"""Incremental tokenization: routes, boundary reasons, exactness and rebuild from records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dressage.tito.incremental import IndexedTurn, SegmentIndex, TitoPlan
from dressage.tito.qwen_profile import Qwen35Profile
from dressage.tito.tokenizer import Tokenizer
from tests.tito.corpus import TOOLS


@pytest.fixture(scope="module")
def think(qwen_tok: Tokenizer) -> Qwen35Profile:
    return Qwen35Profile(thinking=True, tokenizer=qwen_tok)


@pytest.fixture(scope="module")
def nothink(qwen_tok: Tokenizer) -> Qwen35Profile:
    return Qwen35Profile(thinking=False, tokenizer=qwen_tok)


def model_output(
    profile: Qwen35Profile, messages: list[dict[str, Any]], reply: dict[str, Any], tools: Any
) -> str:
    """The text a well-behaved model generates for ``reply`` (template form, ends with <|im_end|>)."""
    parts = profile.render_parts([*messages, reply], tools, add_generation_prompt=False)
    return parts.messages[-1][len(profile.generation_prompt_suffix()) : -1]


def turn(
    index: SegmentIndex,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    tools: Any = None,
    turn_id: str | None = None,
    gen_ids: list[int] | None = None,
) -> tuple[TitoPlan, IndexedTurn]:
    """Plan a request, check exactness, 'generate' ``reply`` and record the turn."""
    plan = index.plan(messages, tools)
    tok = index.tokenizer
    assert plan.prompt_ids == tok.encode(index.profile.render(messages, tools))
    out = model_output(index.profile, messages, reply, tools)
    ids = gen_ids if gen_ids is not None else tok.encode(out)
    rec = index.record(plan, turn_id or f"t{len(index._turns)}", ids)
    return plan, rec


def tool_reply(i: int, think: bool = True) -> dict[str, Any]:
    """An assistant tool call; reasoning only when the model thinks (no-think prompts close <think>)."""
    args = {"cmd": f'grep -n "x{i}" file_{i}.py', "env": {"K": [i, "v"]}}
    return {
        "role": "assistant",
        "content": "",
        "reasoning_content": f"Step {i}: look." if think else None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps(args)}}
        ],
    }


def test_tool_loop_appends(think: Qwen35Profile) -> None:
    index = SegmentIndex(think)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    routes = []
    for i in range(30):
        reply = tool_reply(i)
        plan, _ = turn(index, msgs, reply, TOOLS)
        routes.append(plan.route)
        msgs += [reply, {"role": "tool", "tool_call_id": f"c{i}", "content": f"file_{i}.py:3: x{i} = 1\n"}]
        if i:
            assert len(plan.delta_ids) < 40  # only the tool result + glue were encoded
    assert routes == ["create"] + ["append"] * 29
    assert len(index.segments) == 1


def test_new_user_turn_after_thinking_is_boundary(think: Qwen35Profile, nothink: Qwen35Profile) -> None:
    for profile in (think, nothink):
        index = SegmentIndex(profile)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
        reply = {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"}
        turn(index, msgs, reply)
        plan = index.plan([*msgs, reply, {"role": "user", "content": "More"}])
        assert plan.route == "create"
        assert plan.boundary_reason == "think_stripped"


def test_compaction_creates(nothink: Qwen35Profile) -> None:
    index = SegmentIndex(nothink)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Agent."},
        {"role": "user", "content": "Task"},
    ]
    for i in range(3):
        reply = tool_reply(i, False)
        turn(index, msgs, reply, TOOLS)
        msgs += [reply, {"role": "tool", "content": f"r{i}"}]
    compacted = [msgs[0], msgs[1], {"role": "user", "content": "Summary so far: ran 3 commands."}]
    plan = index.plan(compacted, TOOLS)
    assert (plan.route, plan.boundary_reason) == ("create", "template_prefix_mismatch")
    # a rewrite that shares only the system turn is a new conversation (a subagent looks the same)
    rewritten = [msgs[0], {"role": "user", "content": "Task. Summary so far: ran 3 commands."}]
    plan = index.plan(rewritten, TOOLS)
    assert (plan.route, plan.boundary_reason) == ("create", "new_conversation")


def test_subagent_interleaved(nothink: Qwen35Profile) -> None:
    index = SegmentIndex(nothink)
    main: list[dict[str, Any]] = [
        {"role": "system", "content": "Main agent."},
        {"role": "user", "content": "Task"},
    ]
    sub: list[dict[str, Any]] = [
        {"role": "system", "content": "Sub agent."},
        {"role": "user", "content": "Subtask"},
    ]
    p, _ = turn(index, main, tool_reply(0, False), TOOLS)
    main += [tool_reply(0, False), {"role": "tool", "content": "r0"}]
    p_sub, _ = turn(index, sub, tool_reply(10, False), TOOLS)
    assert (p_sub.route, p_sub.boundary_reason) == ("create", "new_context")
    sub += [tool_reply(10, False), {"role": "tool", "content": "r10"}]
    for i in range(1, 4):
        pm, _ = turn(index, main, tool_reply(i, False), TOOLS)
        assert (pm.route, pm.segment_id) == ("append", p.segment_id)
        main += [tool_reply(i, False), {"role": "tool", "content": f"r{i}"}]
        ps, _ = turn(index, sub, tool_reply(10 + i, False), TOOLS)
        assert (ps.route, ps.segment_id) == ("append", p_sub.segment_id)
        sub += [tool_reply(10 + i, False), {"role": "tool", "content": f"r{10 + i}"}]
    assert len(index.segments) == 2


def test_retry_branches(nothink: Qwen35Profile) -> None:
    index = SegmentIndex(nothink)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Task"}]
    turn(index, msgs, tool_reply(0, False), TOOLS)
    msgs += [tool_reply(0, False), {"role": "tool", "content": "r0"}]
    first, _ = turn(index, msgs, tool_reply(1, False), TOOLS)
    retry = index.plan(msgs, TOOLS)
    assert retry.route == "branch" and retry.delta_ids == () and retry.fork_at == "prompt"
    assert retry.prompt_ids == first.prompt_ids
    index.record(retry, "retry", index.tokenizer.encode("other answer<|im_end|>"))
    assert len(index.segments) == 2
    # the first branch's tip still appends
    nxt = index.plan([*msgs, tool_reply(1, False), {"role": "tool", "content": "r1"}], TOOLS)
    assert (nxt.route, nxt.segment_id) == ("append", first.segment_id)


def test_tools_changed(nothink: Qwen35Profile) -> None:
    index = SegmentIndex(nothink)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Task"}]
    turn(index, msgs, tool_reply(0, False), TOOLS)
    plan = index.plan([*msgs, tool_reply(0, False), {"role": "tool", "content": "r"}], TOOLS[:1])
    assert (plan.route, plan.boundary_reason) == ("create", "tools_changed")


def test_generated_ids_are_ground_truth(nothink: Qwen35Profile) -> None:
    """Non-canonical generated ids are kept; the next prompt still starts with them."""
    index = SegmentIndex(nothink)
    tok = index.tokenizer
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Say hello"}]
    reply = tool_reply(0, False)
    text = model_output(nothink, msgs, reply, TOOLS)
    odd = [i for ch in text.removesuffix("<|im_end|>") for i in tok.encode(ch)] + [
        tok.require_id("<|im_end|>")
    ]
    assert odd != tok.encode(text)
    plan0 = index.plan(msgs, TOOLS)
    index.record(plan0, "t0", odd)
    plan = index.plan([*msgs, reply, {"role": "tool", "content": "again"}], TOOLS)
    assert plan.route == "append"
    assert plan.prompt_ids[: len(plan0.prompt_ids) + len(odd)] == [*plan0.prompt_ids, *odd]
    assert tok.decode(plan.prompt_ids) == plan.prompt_text


def test_truncated_generation_is_not_split_mid_text(nothink: Qwen35Profile) -> None:
    """(A tool result follows, since any new user query strips the think block in Qwen3.5.)"""
    index = SegmentIndex(nothink)
    tok = index.tokenizer
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Write"}]
    plan0 = index.plan(msgs)
    index.record(plan0, "t0", tok.encode("Hello wor"))  # cut by max_tokens, no <|im_end|>
    plan = index.plan(
        [*msgs, {"role": "assistant", "content": "Hello world"}, {"role": "tool", "content": "go"}]
    )
    assert plan.route == "create" and plan.boundary_reason == "unsafe_split"
    ok = index.plan([*msgs, {"role": "assistant", "content": "Hello wor"}, {"role": "tool", "content": "go"}])
    assert ok.route == "append"  # the suffix starts with <|im_end|>: a safe split
    assert ok.prompt_ids == tok.encode(ok.prompt_text)


def test_rebuild_from_records(think: Qwen35Profile) -> None:
    index = SegmentIndex(think)
    records: list[IndexedTurn] = []
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Ünïcode sys ✓"},
        {"role": "user", "content": "e\u0301 go"},
    ]
    for i in range(4):
        _, rec = turn(index, msgs, tool_reply(i), TOOLS)
        records.append(rec)
        msgs += [tool_reply(i), {"role": "tool", "content": f"résumé {i} 日本"}]
    retry = index.plan(msgs[:-2], TOOLS)
    records.append(index.record(retry, "retry", index.tokenizer.encode("x<|im_end|>")))
    rebuilt = SegmentIndex.rebuild(think, records)
    assert {k: (v.ids, v.text, v.anchors) for k, v in rebuilt.segments.items()} == {
        k: (v.ids, v.text, v.anchors) for k, v in index.segments.items()
    }
    a, b = index.plan(msgs, TOOLS), rebuilt.plan(msgs, TOOLS)
    assert (a.route, a.segment_id, a.delta_ids, a.prompt_ids) == (
        "append",
        b.segment_id,
        b.delta_ids,
        b.prompt_ids,
    )
