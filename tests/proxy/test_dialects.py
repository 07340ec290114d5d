"""Anthropic Messages and OpenAI Responses at the proxy: tool loops token-exact on the shared path;
and one conversation through every dialect (chat, Messages, Responses, Gemini) records the same ids.

A scripted engine (SGLang's protocol on loopback) plays the policy and writes Qwen3.5 XML tool
calls; the official ``anthropic`` and ``openai`` clients play the agents. Every loop must land in
one segment (each turn appends to the previous one's exact tokens), on SQLite and PostgreSQL, with
the dialect recorded on each turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from openai import OpenAI

from dressage.store import EventStore
from dressage.tito import get_profile
from dressage.tito.chat_template import render_qwen35
from tests.proxy.conftest import Harness, LoopThread
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

LS_TOOL_ANTHROPIC = {
    "name": "ls",
    "description": "List a directory",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "cache_control": {"type": "ephemeral"},
    "defer_loading": False,
}
LS_TOOL_RESPONSES = {
    "type": "function",
    "name": "ls",
    "description": "List a directory",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def two_step(prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
    """First a reasoned tool call, then (once a tool result is in the prompt) a reasoned answer."""
    if "<tool_response>" not in prompt:
        return "I should look.\n</think>\n\n" + qwen_tool_call("ls", path="/tmp")
    return "The listing is in.\n</think>\n\nThere is one file: a.txt."


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    with ScriptedEngine(two_step).running() as eng:
        yield eng


@pytest.fixture
def proxy_s(loop_thread: LoopThread, store: EventStore, scripted: ScriptedEngine) -> Iterator[Harness]:
    """A proxy in front of the scripted engine, on each backend in turn."""
    h = Harness(loop_thread, store, scripted.url)
    yield h
    loop_thread.call(h.server.stop())


def _turns(proxy: Harness, sid: str) -> list[Any]:
    return proxy.store.turns.read(session_id=sid, with_experts=False)


def _segment_ids(turns: list[Any]) -> list[int]:
    ids: list[int] = []
    for t in turns:
        ids += [int(x) for x in t.context_ids] + [int(x) for x in t.generated_ids]
    return ids


def _assert_one_exact_segment(turns: list[Any], final_messages: list[dict[str, Any]], tools: Any) -> None:
    """Every turn appended to one segment, whose ids are the template's rendering of the conversation."""
    assert [t.segment_index for t in turns] == [0] * len(turns)
    assert [t.route for t in turns] == ["create"] + ["append"] * (len(turns) - 1)
    text = render_qwen35(final_messages, tools, add_generation_prompt=False, enable_thinking=True)
    expected = get_profile("qwen3.5").tokenizer.encode(text.removesuffix("\n"))
    assert _segment_ids(turns) == expected


def test_messages_tool_loop_is_token_exact(proxy_s: Harness) -> None:
    run = proxy_s.run()
    s = proxy_s.session(run)
    import anthropic  # here, not at the top: only this test's xdist worker pays the import

    client = anthropic.Anthropic(base_url=s.base_url.removesuffix("/v1"), api_key="ignored", max_retries=0)
    system = [{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "What is in /tmp?"}]},
        {"role": "system", "content": "Use tools."},  # Claude Code 2.1 sends one here
    ]
    kw: dict[str, Any] = {
        "model": "claude-x", "max_tokens": 256, "system": system, "tools": [LS_TOOL_ANTHROPIC],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }  # fmt: skip
    first = client.messages.create(messages=messages, **kw)
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "I should look."
    call = first.content[1]
    assert call.name == "ls" and call.input == {"path": "/tmp"} and first.stop_reason == "tool_use"
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}
    )
    messages.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}]}
    )
    counted = client.messages.count_tokens(
        model="claude-x", system=system, messages=messages, tools=[LS_TOOL_ANTHROPIC],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    second = client.messages.create(messages=messages, **kw)
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[1].text == "There is one file: a.txt." and second.stop_reason == "end_turn"
    assert second.usage.input_tokens == counted.input_tokens
    turns = _turns(proxy_s, s.session_id)
    assert [t.info["dialect"] for t in turns] == ["messages", "messages"]
    final = [
        {"role": "system", "content": "You are careful.\n\nUse tools."},
        {"role": "user", "content": "What is in /tmp?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look.",
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "ls", "arguments": {"path": "/tmp"}}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
        {"role": "assistant", "content": "There is one file: a.txt.", "reasoning_content": "The listing is in."},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {k: LS_TOOL_ANTHROPIC[k] for k in ("name", "description")}
              | {"parameters": LS_TOOL_ANTHROPIC["input_schema"]}}]  # fmt: skip
    _assert_one_exact_segment(turns, final, tools)


def test_messages_stream_equals_the_message(proxy_s: Harness) -> None:
    run = proxy_s.run()
    import anthropic  # here, not at the top: only this test's xdist worker pays the import

    client = anthropic.Anthropic(
        base_url=proxy_s.session(run).base_url.removesuffix("/v1"), api_key="x", max_retries=0
    )
    kw: dict[str, Any] = {
        "model": "m", "max_tokens": 256, "tools": [LS_TOOL_ANTHROPIC],
        "messages": [{"role": "user", "content": "What is in /tmp?"}], "thinking": {"type": "adaptive"},
    }  # fmt: skip
    with client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    plain = anthropic.Anthropic(
        base_url=proxy_s.session(run).base_url.removesuffix("/v1"), api_key="x", max_retries=0
    ).messages.create(**kw)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"

    def blocks(message: Any) -> list[dict[str, Any]]:  # tool ids are per turn, so per session
        return [{**b.model_dump(), "id": None} for b in message.content]

    assert blocks(streamed) == blocks(plain) and streamed.stop_reason == plain.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == plain.usage.output_tokens


def test_messages_errors_have_anthropics_shape(proxy_s: Harness) -> None:
    run = proxy_s.run()
    s = proxy_s.session(run)
    base = proxy_s.server.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        ok = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        r = http.post("/v1/messages", json=ok, headers={"x-api-key": s.token})
        assert r.status_code == 200, r.text
        r = http.post("/v1/messages", json=ok, headers={"x-api-key": "sk-unknown"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        cases = [
            ({**ok, "max_tokens": None}, "max_tokens"),
            ({**ok, "frobnicate": 1}, "frobnicate"),
            ({**ok, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
            ({**ok, "tools": [{"name": "x", "input_schema": "not a schema"}]}, "input_schema"),
            ({**ok, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
            ({**ok, "tool_choice": {"type": "tool", "name": "nope"}}, "tools"),
        ]
        for body, needle in cases:
            r = http.post("/v1/messages", json=body, headers={"x-api-key": s.token})
            assert r.status_code == 400, (body, r.text)
            err = r.json()
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
            assert needle in err["error"]["message"], err
    assert len(_turns(proxy_s, s.session_id)) == 1


def test_responses_tool_loop_chains_from_the_log(proxy_s: Harness) -> None:
    """``store`` + ``previous_response_id`` carry the conversation, also across a proxy restart."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    client = OpenAI(base_url=s.base_url, api_key="ignored", max_retries=0)
    tools: list[Any] = [LS_TOOL_RESPONSES, {"type": "web_search"}]
    kw: dict[str, Any] = {"model": "m", "instructions": "You are careful.", "tools": tools,
                          "reasoning": {"effort": "medium", "summary": "auto"}}  # fmt: skip
    first = client.responses.create(input="What is in /tmp?", **kw)
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.name == "ls" and json.loads(call.arguments) == {"path": "/tmp"}
    proxy_s.restart()  # the chain is served from the log
    client = OpenAI(base_url=proxy_s.server.session_url(s.token), api_key="x", max_retries=0)
    second = client.responses.create(
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}],
        **kw,
    )
    assert second.output_text == "There is one file: a.txt." and second.status == "completed"
    assert second.usage.output_tokens_details.reasoning_tokens > 0
    turns = _turns(proxy_s, s.session_id)
    assert [t.info["dialect"] for t in turns] == ["responses", "responses"]
    assert turns[0].info["dropped_tools"] == ["web_search"]
    final = [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "What is in /tmp?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look.",
         "tool_calls": [{"id": call.call_id, "type": "function", "function": {"name": "ls", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt"},
        {"role": "assistant", "content": "There is one file: a.txt.", "reasoning_content": "The listing is in."},
    ]  # fmt: skip
    fn = {k: v for k, v in LS_TOOL_RESPONSES.items() if k != "type"}
    _assert_one_exact_segment(turns, final, [{"type": "function", "function": fn}])
    with pytest.raises(Exception, match="not a stored response"):
        client.responses.create(previous_response_id="resp_nope", input="x", model="m")


def test_responses_stateless_stream_equals_the_response(proxy_s: Harness) -> None:
    """Codex's way: ``store: false``, the whole input every time, streamed; items sent back verbatim."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in /tmp?"}]},
    ]
    kw: dict[str, Any] = {"model": "m", "tools": [LS_TOOL_RESPONSES], "store": False, "parallel_tool_calls": False,
                          "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc"}  # fmt: skip
    events = list(client.responses.create(input=items, stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    streamed = events[-1].response
    items += [item.model_dump(exclude_none=True) for item in streamed.output]
    items.append({"type": "function_call_output", "call_id": streamed.output[-1].call_id, "output": "a.txt"})
    second = client.responses.create(input=items, **kw)
    assert second.output_text == "There is one file: a.txt."
    turns = _turns(proxy_s, s.session_id)
    assert [t.route for t in turns] == ["create", "append"]
    assert "responses" not in turns[0].info and turns[0].info["ignored_params"] == [
        "parallel_tool_calls", "prompt_cache_key"
    ]  # fmt: skip
    with pytest.raises(Exception, match="not a stored response"):
        client.responses.create(previous_response_id=streamed.id, input="x", model="m")


def test_responses_refusals_are_clear(proxy_s: Harness) -> None:
    run = proxy_s.run()
    s = proxy_s.session(run)
    with httpx.Client(base_url=s.base_url, timeout=30) as http:
        ok = {"model": "m", "input": "hi", "max_output_tokens": 8}
        assert http.post("/responses", json=ok).status_code == 200
        cases = [
            ({**ok, "tools": [{"type": "custom", "name": "apply_patch"}]}, "custom"),
            ({**ok, "text": {"format": {"type": "json_schema"}}}, "text.format"),
            ({**ok, "include": ["file_search_call.results"]}, "include"),
            ({**ok, "input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
            ({**ok, "background": True}, "background"),
        ]
        for body, needle in cases:
            r = http.post("/responses", json=body)
            assert r.status_code == 400, (body, r.text)
            assert needle in json.dumps(r.json()["error"]), r.text


SYSTEM = "You are careful."
QUESTION = "What is in /tmp?"
LS_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _chat_loop(http: httpx.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "ls", "description": "List a directory", "parameters": LS_SCHEMA},
        }
    ]
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    body = {
        "model": "m",
        "messages": messages,
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    reply = http.post("chat/completions", json=body).json()["choices"][0]["message"]
    call = reply["tool_calls"][0]
    messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    assert http.post("chat/completions", json=body).status_code == 200


def _messages_loop(http: httpx.Client) -> None:
    tools = [{"name": "ls", "description": "List a directory", "input_schema": LS_SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    body = {"model": "m", "max_tokens": 256, "system": SYSTEM, "messages": messages, "tools": tools,
            "thinking": {"type": "enabled"}}  # fmt: skip
    reply = http.post("messages", json=body).json()
    call = reply["content"][-1]
    messages += [{"role": "assistant", "content": reply["content"]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "a.txt"}]}]  # fmt: skip
    assert http.post("messages", json=body).status_code == 200


def _responses_loop(http: httpx.Client) -> None:
    tools = [{"type": "function", "name": "ls", "description": "List a directory", "parameters": LS_SCHEMA}]
    items: list[Any] = [{"type": "message", "role": "user", "content": QUESTION}]
    body = {"model": "m", "instructions": SYSTEM, "input": items, "tools": tools, "store": False,
            "reasoning": {"effort": "medium"}}  # fmt: skip
    output = http.post("responses", json=body).json()["output"]
    items += [*output, {"type": "function_call_output", "call_id": output[-1]["call_id"], "output": "a.txt"}]
    assert http.post("responses", json=body).status_code == 200


def _gemini_loop(http: httpx.Client) -> None:
    tools = [
        {
            "functionDeclarations": [
                {"name": "ls", "description": "List a directory", "parametersJsonSchema": LS_SCHEMA}
            ]
        }
    ]
    contents: list[Any] = [{"role": "user", "parts": [{"text": QUESTION}]}]
    body = {"systemInstruction": {"parts": [{"text": SYSTEM}]}, "contents": contents, "tools": tools,
            "generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}}  # fmt: skip
    reply = http.post("../v1beta/models/m:generateContent", json=body).json()["candidates"][0]["content"]
    call = reply["parts"][-1]["functionCall"]
    answer = {"functionResponse": {"id": call["id"], "name": "ls", "response": {"output": "a.txt"}}}
    contents += [reply, {"role": "user", "parts": [answer]}]
    assert http.post("../v1beta/models/m:generateContent", json=body).status_code == 200


def test_every_dialect_records_the_same_ids(proxy_s: Harness) -> None:
    """One conversation (system prompt, question, reasoned tool call, result, reasoned answer) through
    each dialect as its clients send it back: every session records the same token ids, one segment."""
    run = proxy_s.run()
    recorded = {}
    for name, loop in [("chat", _chat_loop), ("messages", _messages_loop), ("responses", _responses_loop),
                       ("gemini", _gemini_loop)]:  # fmt: skip
        s = proxy_s.session(run)
        with httpx.Client(base_url=s.base_url + "/", timeout=30) as http:
            loop(http)
        turns = _turns(proxy_s, s.session_id)
        assert [t.info["dialect"] for t in turns] == [name, name]
        assert [t.route for t in turns] == ["create", "append"]
        recorded[name] = (_segment_ids(turns), [len(t.generated_ids) for t in turns])
    assert all(ids == recorded["chat"] for ids in recorded.values()), {
        k: len(v[0]) for k, v in recorded.items()
    }
