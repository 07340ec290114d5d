"""Chat-completions breadth on the log: n sibling turns, top logprobs, penalties, constraints, refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from dressage.store import EventStore
from dressage.training.materialize import Trajectory, materialize_trajectory
from tests.proxy.conftest import Harness, LoopThread
from tests.proxy.helpers import NOTHINK, TOOLS
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
THINK_OFF: dict[str, Any] = {"extra_body": NOTHINK}
THINK_ON: dict[str, Any] = {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}


@pytest.fixture
def client(proxy: Harness) -> Iterator[OpenAI]:
    session = proxy.session(proxy.run())
    with OpenAI(base_url=session.base_url, api_key="x", max_retries=0) as c:
        c.session_id = session.session_id  # type: ignore[attr-defined]
        c.token = session.token  # type: ignore[attr-defined]
        yield c


def _turns(proxy: Harness, client: OpenAI) -> list[Any]:
    return proxy.store.turns.read(session_id=client.session_id)  # type: ignore[attr-defined]


def test_n_choices_are_sibling_branches_all_trainable_and_replayed_after_a_restart(
    proxy: Harness, client: OpenAI
) -> None:
    kw: dict[str, Any] = {
        "model": "m",
        "messages": MSGS,
        "max_tokens": 5,
        "temperature": 0.9,
        "seed": 7,
        "tools": TOOLS,
    }
    r = client.chat.completions.create(n=3, logprobs=True, top_logprobs=2, **kw, **THINK_OFF)
    assert [c.index for c in r.choices] == [0, 1, 2]
    turns = _turns(proxy, client)
    assert len(turns) == 3
    first, *siblings = turns
    assert first.route == "create" and first.info["choice"] == {"index": 0, "n": 3, "first": 0}
    for i, t in enumerate(siblings, start=1):
        # Forked at the prompt anchor of an earlier choice (re-planned: the latest equal anchor wins).
        assert t.route == "branch" and t.info["tito"]["fork_at"] == "prompt"
        assert t.parent_turn_id in {x.id for x in turns[:i]}
        assert t.info["choice"] == {"index": i, "n": 3, "first": first.turn_index}
        assert t.thread_index == first.thread_index and t.segment_offset == 0
        assert t.context_ids.tolist() == first.context_ids.tolist()  # the same prompt ids
        assert t.sampling_params["sampling_seed"] == 7 + i
    assert len({t.segment_index for t in turns}) == 3
    for choice, t in zip(r.choices, turns, strict=True):
        assert [e.logprob for e in choice.logprobs.content] == pytest.approx(t.logprobs.tolist())  # type: ignore[union-attr]
        assert len(t.info["top_logprobs"]) == t.generated_ids.size
    assert len({tuple(t.generated_ids.tolist()) for t in turns}) > 1
    assert r.usage is not None and r.usage.completion_tokens == sum(t.generated_ids.size for t in turns)
    traj = Trajectory(client.session_id, 1.0, "completed", 0, 0, 0)  # type: ignore[attr-defined]
    samples = materialize_trajectory(turns, traj)
    assert len(samples) == 3 and all(s.loss_mask.sum() == 5 for s in samples)  # every choice trains
    assert sum(s.is_anchor for s in samples) == 1
    # A retry of the same body, even after a restart, replays all three choices from the log.
    proxy.restart()
    client = OpenAI(base_url=proxy.server.session_url(client.token), api_key="x", max_retries=0)  # type: ignore[attr-defined]
    client.session_id = turns[0].session_id  # type: ignore[attr-defined]
    raw = client.chat.completions.with_raw_response.create(
        n=3, logprobs=True, top_logprobs=2, **kw, **THINK_OFF
    )
    again = raw.parse()
    assert raw.headers.get("x-dressage-replayed") == "1" and len(_turns(proxy, client)) == 3
    assert again.model_dump()["choices"] == r.model_dump()["choices"]
    # The agent continues from choice 2 (a tool result): the next turn appends to choice 2's segment.
    follow = [
        *MSGS,
        {"role": "assistant", "content": r.choices[2].message.content},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    client.chat.completions.create(model="m", messages=follow, max_tokens=3, seed=1, tools=TOOLS, **THINK_OFF)  # type: ignore[arg-type]
    last = _turns(proxy, client)[-1]
    assert r.choices[2].message.content == (r.choices[2].message.content or "").strip()  # re-renders exactly
    assert last.route == "append" and last.segment_index == turns[2].segment_index


def test_n_choices_stream_and_record_each(proxy: Harness, client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=4, temperature=0.9, n=2, stream=True,
        stream_options={"include_usage": True}, **THINK_OFF,
    )  # fmt: skip
    text: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    turns = _turns(proxy, client)
    assert [t.info["choice"]["index"] for t in turns] == [0, 1] and turns[1].route == "branch"
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 8
    replay = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=4, temperature=0.9, n=2, **THINK_OFF
    )
    assert len(_turns(proxy, client)) == 4  # a different body (not streamed): generated anew
    assert len(replay.choices) == 2


def test_top_logprobs_stream_equals_non_stream_and_the_logprob_contract(
    proxy: Harness, client: OpenAI
) -> None:
    kw: dict[str, Any] = {
        "model": "m",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    r = client.chat.completions.create(messages=MSGS, **kw, **THINK_OFF)
    other = proxy.session(proxy.run())
    with OpenAI(base_url=other.base_url, api_key="x") as c2:
        chunks = list(c2.chat.completions.create(messages=MSGS, stream=True, **kw, **THINK_OFF))
    streamed = [
        e
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content or []
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in r.choices[0].logprobs.content]  # type: ignore[union-attr]
    for e in r.choices[0].logprobs.content:  # type: ignore[union-attr]
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6
    # One entry per generated token, the end token included, as completion_tokens counts it.
    ended = client.chat.completions.create(
        model="m",
        messages=MSGS,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        **{"extra_body": {**NOTHINK, "regex": "ab"}},
    )
    content = ended.choices[0].logprobs.content  # type: ignore[union-attr]
    assert ended.choices[0].message.content == "ab" and ended.choices[0].finish_reason == "stop"
    assert ended.usage is not None and len(content) == ended.usage.completion_tokens
    assert content[-1].token in ("<|im_end|>", "<|endoftext|>")
    assert "".join(e.token for e in content[:-1]) == "ab"


def test_penalties_reach_the_engine_and_are_recorded(proxy: Harness, client: OpenAI) -> None:
    kw: dict[str, Any] = {"model": "m", "messages": MSGS, "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**kw, **THINK_OFF)
    penalised = client.chat.completions.create(
        **kw, frequency_penalty=-0.5, presence_penalty=-0.3,
        extra_body={**NOTHINK, "repetition_penalty": 1.2},
    )  # fmt: skip
    assert penalised.choices[0].message.content != plain.choices[0].message.content
    recorded = _turns(proxy, client)[-1].sampling_params
    assert (recorded["frequency_penalty"], recorded["presence_penalty"], recorded["repetition_penalty"]) == (
        -0.5, -0.3, 1.2,
    )  # fmt: skip


def test_a_grammar_waits_for_the_end_of_the_thinking(proxy: Harness, client: OpenAI) -> None:
    kw: dict[str, Any] = {"model": "m", "messages": MSGS, "max_tokens": 6, "temperature": 0}
    free = client.chat.completions.create(**kw, **THINK_ON)
    gated = client.chat.completions.create(
        **kw, extra_body={"chat_template_kwargs": {"enable_thinking": True}, "regex": "[0-9]+"}
    )
    direct = client.chat.completions.create(**kw, extra_body={**NOTHINK, "regex": "[0-9]+"})
    # Thinking on: the reasoning is free (the same as without a grammar); thinking off: constrained.
    assert gated.choices[0].message.reasoning_content == free.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    assert (direct.choices[0].message.content or "").isdigit()
    assert _turns(proxy, client)[1].sampling_params["regex"] == "[0-9]+"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"tool_choice": "required", "tools": TOOLS, "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "structural_tag"}}, "response_format"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"n": 17}, "n"),
        ({"n": 0}, "n"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    proxy: Harness, client: OpenAI, body: dict[str, Any], param: str
) -> None:
    url = str(client.base_url).rstrip("/") + "/chat/completions"
    r = httpx.post(url, json={"model": "m", "messages": MSGS, "max_tokens": 2, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert _turns(proxy, client) == []


def test_an_invalid_grammar_is_the_engines_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="invalid regex"):
        client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=2, extra_body={**NOTHINK, "regex": "(a"}
        )


# --- shapes, on a scripted engine (a model that closes its thinking and its forced call) --------


FORCED_AFTER_THINKING = "I must call ls.\n</think>\n\n" + qwen_tool_call("ls", path="/tmp")


def _scripted_policy(prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
    if prompt.endswith("<function=ls>\n"):  # the proxy forced the call's opening: finish it
        return "<parameter=path>\n/tmp\n</parameter>\n</function>\n</tool_call>"
    if "ebnf" in sampling:  # a call forced by a grammar after the thinking (checked by the test)
        return FORCED_AFTER_THINKING
    return "I should look.\n</think>\n\nThere is one file."


@pytest.fixture
def scripted_client(loop_thread: LoopThread, sqlite_store: EventStore) -> Iterator[OpenAI]:
    with ScriptedEngine(_scripted_policy).running() as engine:
        h = Harness(loop_thread, sqlite_store, engine.url)
        session = h.session(h.run())
        with OpenAI(base_url=session.base_url, api_key="x", max_retries=0) as c:
            c.session_id = session.session_id  # type: ignore[attr-defined]
            c.harness = h  # type: ignore[attr-defined]
            yield c
        loop_thread.call(h.server.stop())


def test_forced_tool_call_content_is_empty_string_and_reasoning_has_both_keys(
    scripted_client: OpenAI,
) -> None:
    forced: dict[str, Any] = {
        "model": "m", "messages": [{"role": "user", "content": "list /tmp"}], "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "ls"}},
    }  # fmt: skip
    r = scripted_client.chat.completions.create(**forced, **THINK_OFF)
    msg = r.choices[0].message
    assert msg.content == "" and r.choices[0].finish_reason == "tool_calls"  # vLLM's shape
    assert msg.tool_calls and msg.tool_calls[0].function.name == "ls"
    last = list(scripted_client.chat.completions.create(**forced, stream=True, **THINK_OFF))[-1]
    assert last.choices[0].finish_reason == "tool_calls" and last.choices[0].delta.content == ""
    assert last.choices[0].delta.tool_calls and last.choices[0].delta.tool_calls[0].function.name == "ls"  # type: ignore[union-attr]
    auto = scripted_client.chat.completions.create(**{**forced, "tool_choice": "auto"}, **THINK_ON)  # type: ignore[arg-type]
    assert auto.choices[0].message.content == "There is one file."
    assert auto.choices[0].message.reasoning_content == auto.choices[0].message.reasoning == "I should look."  # type: ignore[attr-defined]
    chunks = list(
        scripted_client.chat.completions.create(**{**forced, "tool_choice": "auto"}, stream=True, **THINK_ON)
    )  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in chunks[1:]]
    assert all({"reasoning_content", "reasoning"} <= set(d.model_extra or {}) for d in deltas)
    assert "".join(d.reasoning or "" for d in deltas) == "I should look."  # type: ignore[attr-defined]
    assert "".join(d.content or "" for d in deltas) == "There is one file."
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].delta.content


TWO_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "cat", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("tools", "choice"), [(TWO_TOOLS, "required"), (TOOLS, {"type": "function", "function": {"name": "ls"}})]
)
def test_a_forced_call_with_thinking_on_comes_after_the_reasoning(
    scripted_client: OpenAI, tools: list[dict[str, Any]], choice: Any
) -> None:
    """Thinking on: the model reasons, then the grammar (sent as ``ebnf``) forces the call, in chat
    (plain and streamed), Responses and Messages; the reply carries both the reasoning and the call
    (SGLang's and vLLM's shape)."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    msgs = [{"role": "user", "content": "list /tmp"}]
    r = scripted_client.chat.completions.create(
        model="m",
        messages=msgs,
        tools=tools,
        tool_choice=choice,
        **THINK_ON,  # type: ignore[arg-type]
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content == ""
    assert msg.reasoning_content == "I must call ls."  # type: ignore[attr-defined]
    assert msg.tool_calls and msg.tool_calls[0].function.name == "ls"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"path": "/tmp"}
    chunks = list(
        scripted_client.chat.completions.create(
            model="m",
            messages=msgs,
            tools=tools,
            tool_choice=choice,
            stream=True,
            **THINK_ON,  # type: ignore[arg-type]
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I must call ls."
    streamed = [tc for d in deltas for tc in d.tool_calls or ()]
    assert [tc.function.name for tc in streamed if tc.function and tc.function.name] == ["ls"]  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    named = choice if isinstance(choice, str) else {"type": "function", "name": "ls"}
    resp_tools = [{"type": "function", **t["function"]} for t in tools]
    resp = scripted_client.responses.create(
        model="m",
        input="list /tmp",
        tools=resp_tools,
        tool_choice=named,
        reasoning={"effort": "high"},  # type: ignore[arg-type]
    )
    kinds = [item.type for item in resp.output]
    assert kinds == ["reasoning", "function_call"] and resp.output[1].name == "ls"  # type: ignore[union-attr]
    root = str(scripted_client.base_url).rstrip("/").removesuffix("/v1")
    import anthropic  # here, not at the top: only this test's xdist worker pays the import

    claude = anthropic.Anthropic(base_url=root, api_key="x", max_retries=0)
    forced_msg = claude.messages.create(
        model="m", max_tokens=256, messages=msgs,  # type: ignore[arg-type]
        tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in tools],
        tool_choice={"type": "any"} if isinstance(choice, str) else {"type": "tool", "name": "ls"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    assert [b.type for b in forced_msg.content] == [
        "thinking",
        "tool_use",
    ] and forced_msg.stop_reason == "tool_use"
    # What the engine was sent: the grammar of the allowed calls, which the scripted answer satisfies.
    turns = _turns(scripted_client.harness, scripted_client)  # type: ignore[attr-defined]
    grammar = turns[0].sampling_params["ebnf"]
    assert all(t.sampling_params["ebnf"] == grammar for t in turns)  # stream, Responses, Messages
    names = ['"ls"', '"cat"'] if len(tools) == 2 else ['"ls"']
    assert grammar.count("name ::=") == 1 and all(n in grammar for n in names)
    assert ('"cat"' in grammar) == (len(tools) == 2)
    after = FORCED_AFTER_THINKING.split("</think>", 1)[1]
    assert _is_grammar_accept_string(xgr.Grammar.from_ebnf(grammar), after)
    assert not _is_grammar_accept_string(xgr.Grammar.from_ebnf(grammar), "\n\nThere is one file.")
