"""The Gemini API dialect at the proxy, driven by Google's own ``google-genai`` SDK.

A scripted engine (SGLang's protocol on loopback) plays the policy (tests.proxy.test_dialects'
``two_step``: a reasoned tool call, then a reasoned answer); the SDK plays the agent, streamed and
not. Every loop must land in one segment whose ids are the template's rendering of the
conversation; malformed requests get a 400 in Google's error shape naming the field; the API key
(the session token) never reaches the log or the store.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from dressage.store import EventStore
from tests.conftest import require_module
from tests.proxy.conftest import Harness
from tests.proxy.test_dialects import _assert_one_exact_segment, _turns, proxy_s, scripted  # noqa: F401
from tests.scripted_engine import ScriptedEngine

require_module("google.genai", "the Gemini SDK is in the test extra (google-genai)")

from google import genai  # noqa: E402
from google.genai import types  # noqa: E402

LS_DECL = {
    "name": "ls",
    "description": "List a directory",
    "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]},
}
LS_TOOL = {
    "type": "function",
    "function": {
        "name": "ls",
        "description": "List a directory",
        "parameters": {"properties": {"path": {"type": "string"}}, "required": ["path"], "type": "object"},
    },
}
"""``LS_DECL`` as the template renders it: the SDK sends a schema's keys in its model's field order."""


def _client(proxy: Harness, token: str, **http: Any) -> genai.Client:
    """The SDK on the proxy's plain base URL, the session token as its API key."""
    options = types.HttpOptions(base_url=proxy.server.base_url, **http)
    return genai.Client(api_key=token, http_options=options)


def _config(include_thoughts: bool) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction="You are careful.",
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**LS_DECL)])],
        thinking_config=types.ThinkingConfig(include_thoughts=include_thoughts, thinking_budget=-1),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        temperature=0.5,
        max_output_tokens=256,
    )


def _final(call_id: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "What is in /tmp?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look.",
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "ls", "arguments": {"path": "/tmp"}}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "a.txt"},
        {"role": "assistant", "content": "There is one file: a.txt.", "reasoning_content": "The listing is in."},
    ]  # fmt: skip


def _answer(call: types.FunctionCall) -> types.Content:
    response = types.FunctionResponse(id=call.id, name=call.name, response={"output": "a.txt"})
    return types.Content(role="user", parts=[types.Part(function_response=response)])


def test_sdk_tool_loop_is_token_exact(proxy_s: Harness) -> None:  # noqa: F811
    """Thought parts off: the reasoning comes back in the thoughtSignature, and the loop stays exact."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    client = _client(proxy_s, s.token)
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="What is in /tmp?")])]
    first = client.models.generate_content(model="gemini-x", contents=contents, config=_config(False))
    parts = first.candidates[0].content.parts
    assert [p.thought for p in parts] == [None] and parts[0].thought_signature
    call = parts[0].function_call
    assert call.name == "ls" and call.args == {"path": "/tmp"} and call.id
    assert first.candidates[0].finish_reason == types.FinishReason.STOP
    retried = client.models.generate_content(model="gemini-x", contents=contents, config=_config(False))
    assert retried.model_dump(exclude={"sdk_http_response"}) == first.model_dump(
        exclude={"sdk_http_response"}
    )
    assert retried.sdk_http_response.headers["x-dressage-replayed"] == "1"  # the same body: from the log
    assert len(_turns(proxy_s, s.session_id)) == 1
    contents += [first.candidates[0].content, _answer(call)]
    counted = client.models.count_tokens(model="gemini-x", contents=contents)
    second = client.models.generate_content(model="gemini-x", contents=contents, config=_config(False))
    assert second.text == "There is one file: a.txt."
    turns = _turns(proxy_s, s.session_id)
    assert [t.info["dialect"] for t in turns] == ["gemini", "gemini"]
    usage = second.usage_metadata
    assert usage.prompt_token_count == len(turns[1].context_ids) + len(turns[0].context_ids) + len(
        turns[0].generated_ids
    )
    assert usage.candidates_token_count + usage.thoughts_token_count == len(turns[1].generated_ids)
    assert usage.thoughts_token_count > 0 and usage.total_token_count == usage.prompt_token_count + len(
        turns[1].generated_ids
    )
    assert counted.total_tokens < usage.prompt_token_count  # no system instruction nor tools counted
    _assert_one_exact_segment(turns, _final(call.id), [LS_TOOL])


def test_sdk_stream_with_thoughts_is_token_exact(
    proxy_s: Harness,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Streamed, thought parts on: the SDK's chunks rebuild the same turn, and the loop stays exact.

    Configured as the Gemini CLI is: ``GOOGLE_GEMINI_BASE_URL`` is the session's ``/s/<token>`` base
    and the API key is anything."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", s.base_url.removesuffix("/v1"))
    client = genai.Client(api_key="not-the-token")
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="What is in /tmp?")])]
    chunks = list(
        client.models.generate_content_stream(model="gemini-x", contents=contents, config=_config(True))
    )
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert "".join(p.text for p in parts if p.thought) == "I should look."
    calls = [p.function_call for p in parts if p.function_call]
    assert len(calls) == 1 and calls[0].args == {"path": "/tmp"}
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.thoughts_token_count > 0
    contents += [types.Content(role="model", parts=parts), _answer(calls[0])]
    stream = client.models.generate_content_stream(model="gemini-x", contents=contents, config=_config(True))
    text = "".join(p.text or "" for c in stream for p in c.candidates[0].content.parts if not p.thought)
    assert text == "There is one file: a.txt."
    turns = _turns(proxy_s, s.session_id)
    _assert_one_exact_segment(turns, _final(calls[0].id), [LS_TOOL])


def test_refusals_name_the_field_in_googles_shape(proxy_s: Harness) -> None:  # noqa: F811
    run = proxy_s.run()
    s = proxy_s.session(run)
    ok: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    cases = [
        ({**ok, "safetySettings": []}, "safetySettings"),
        ({**ok, "generationConfig": {"presencePenalty": 1.0}}, "generationConfig.presencePenalty"),
        ({**ok, "generationConfig": {"temperature": "hot"}}, "generationConfig.temperature"),
        ({**ok, "generationConfig": {"topP": 0}}, "generationConfig.topP"),
        ({**ok, "generationConfig": {"responseMimeType": "text/x.enum"}}, "responseMimeType"),
        ({**ok, "generationConfig": {"responseSchema": {"type": "OBJECT"}}}, "responseMimeType"),
        ({**ok, "tools": [{"googleSearch": {}}]}, "tools[0].googleSearch"),
        ({**ok, "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT", "oneOf": []}}]}]},
         "tools[0].functionDeclarations[0].parameters.oneOf"),
        ({**ok, "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "toolConfig.functionCallingConfig.mode"),
        ({**ok, "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}}, "functionCallingConfig.mode"),
        ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]},
         "contents[0].parts[0].inlineData"),
        ({"contents": [{"role": "tool", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"role": "model", "parts": [{"text": "x", "thoughtSignature": "Zm9v"}]}]},
         "contents[0].parts[0].thoughtSignature"),
        ({"contents": []}, "contents"),
    ]  # fmt: skip
    with httpx.Client(base_url=proxy_s.server.base_url, timeout=30) as http:
        url = "/v1beta/models/m:generateContent"
        r = http.post(url, json=ok, headers={"x-goog-api-key": s.token})
        assert r.status_code == 200, r.text
        r = http.post(url, json=ok, headers={"x-goog-api-key": "unknown-key"})
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
        for body, needle in cases:
            r = http.post(url, json=body, headers={"x-goog-api-key": s.token})
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT", err
            assert needle in err["message"], (needle, err)
        r = http.post("/v1beta/models/m:streamGenerateContent", json=ok, params={"key": s.token})
        assert r.status_code == 400 and "alt=sse" in r.json()["error"]["message"]
    assert len(_turns(proxy_s, s.session_id)) == 1


def test_the_api_key_is_never_logged_nor_stored(
    proxy_s: Harness,  # noqa: F811
    scripted: ScriptedEngine,  # noqa: F811
    store: EventStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The session token as ``?key=`` and ``x-goog-api-key``, on success and on failure: in no log line,
    in no stored turn or session."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    body = {
        "contents": [{"parts": [{"text": "What is in /tmp?"}]}],
        "tools": [{"functionDeclarations": [LS_DECL]}],
    }
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=proxy_s.server.base_url, timeout=30) as http:
        r = http.post("/v1beta/models/m:generateContent", json=body, params={"key": s.token})
        assert r.status_code == 200, r.text
        with http.stream(
            "POST",
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            json=body,
            headers={"x-goog-api-key": s.token},
        ) as streamed:
            assert streamed.status_code == 200 and streamed.read().startswith(b"data: {")
        bad = http.post("/v1beta/models/m:generateContent", json={"contents": "x"}, params={"key": s.token})
        assert bad.status_code == 400 and s.token not in bad.text
        scripted._http.stop()  # the engine goes away: the proxy logs the failure (with the URL it served)
        body["contents"][0]["parts"][0]["text"] = "And now?"
        failed = http.post("/v1beta/models/m:generateContent", json=body, params={"key": s.token})
        assert failed.status_code == 502 and failed.json()["error"]["status"] == "UNAVAILABLE", failed.text
    turns = _turns(proxy_s, s.session_id)
    assert len(turns) == 2
    server_side = [
        r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))
    ]  # the client's own
    assert any(r.name.startswith("dressage") for r in server_side)  # the engine failure was logged
    assert not [r for r in server_side if s.token in r.getMessage()]
    for turn in turns:
        assert s.token not in repr(turn)
    for session in store.sessions.list(run):
        assert s.token not in repr(session)


def test_generation_config_reaches_the_engine(proxy_s: Harness, scripted: ScriptedEngine) -> None:  # noqa: F811
    """Sampling, stops, seed, several candidates and a JSON schema: as SGLang sampling params, and a
    reply with one candidate per recorded turn whose usage sums them."""
    run = proxy_s.run()
    s = proxy_s.session(run)
    schema = {"type": "OBJECT", "properties": {"b": {"type": "STRING", "nullable": True}, "a": {"type": "INTEGER"}},
              "propertyOrdering": ["a", "b"]}  # fmt: skip
    config = {"temperature": 0.3, "topP": 0.9, "topK": 5, "seed": 7, "stopSequences": ["END"], "candidateCount": 2,
              "maxOutputTokens": 64, "responseMimeType": "application/json", "responseSchema": schema,
              "thinking_config": {"thinkingBudget": 0}}  # fmt: skip
    body = {"contents": [{"parts": [{"text": "What is in /tmp?"}]}], "generationConfig": config}
    with httpx.Client(base_url=s.base_url.removesuffix("/v1"), timeout=30) as http:
        r = http.post("/v1beta/models/m:generateContent", json=body)
        assert r.status_code == 200, r.text
        reply = r.json()
        streamed = http.post("/v1beta/models/m:streamGenerateContent?alt=sse", json=body)
        assert streamed.status_code == 200
    sent = scripted.sampling[-4]
    assert (
        sent["temperature"] == 0.3
        and sent["top_p"] == 0.9
        and sent["top_k"] == 5
        and sent["max_new_tokens"] == 64
    )
    assert sent["stop"] == ["END"] and sent["sampling_seed"] == 7
    assert sent["json_schema"] == (
        '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]}}}'
    )
    assert [c["index"] for c in reply["candidates"]] == [0, 1]
    turns = _turns(proxy_s, s.session_id)
    assert len(turns) == 4 and [t.info["dialect"] for t in turns] == ["gemini"] * 4
    usage = reply["usageMetadata"]
    assert scripted.prompts[-4].endswith("<think>\n\n</think>\n\n")  # thinkingBudget 0: thinking off
    generated = len(turns[0].generated_ids) + len(turns[1].generated_ids)
    assert usage["candidatesTokenCount"] + usage["thoughtsTokenCount"] == generated
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + generated
    assert usage["promptTokenCount"] == len(turns[0].context_ids)
    chunks = [
        json.loads(line[len("data: ") :]) for line in streamed.text.splitlines() if line.startswith("data: ")
    ]
    assert sorted({c["candidates"][0]["index"] for c in chunks}) == [0, 1]
    last = chunks[-1]["usageMetadata"]
    assert last["candidatesTokenCount"] + last["thoughtsTokenCount"] == sum(
        len(t.generated_ids) for t in turns[2:]
    )
    assert [c["candidates"][0]["finishReason"] for c in chunks if "finishReason" in c["candidates"][0]] == [
        "STOP"
    ] * 2


def test_function_calling_config_and_thinking_map_onto_the_conversation() -> None:
    """``functionCallingConfig`` and ``thinkingConfig`` as the shared conversation's switches."""
    from dressage.proxy.dialects.gemini import parse_gemini_request

    fns = [{"name": "ls", "parametersJsonSchema": {"type": "object"}}, {"name": "cat"}]

    def parse(**extra: Any) -> Any:
        body = {"contents": [{"parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": fns}], **extra}
        return parse_gemini_request(json.dumps(body).encode(), stream=False)

    def fcc(**config: Any) -> dict[str, Any]:
        return {"toolConfig": {"functionCallingConfig": config}}

    assert (parse().parse_tools, parse().force_tool) == (True, None)
    assert (parse(**fcc(mode="NONE")).parse_tools, parse(**fcc(mode="NONE")).force_tool) == (False, None)
    assert parse(**fcc(mode="ANY")).force_tool == ""
    assert parse(**fcc(mode="ANY", allowedFunctionNames=["cat"])).force_tool == "cat"
    assert parse(**fcc(mode="ANY", allowedFunctionNames=["cat", "ls"])).force_tool == ""
    thinking = {"generationConfig": {"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}}}
    conv = parse(**thinking)
    assert conv.enable_thinking is True and conv.include_thoughts
    assert conv.ignored == ["generationConfig.thinkingConfig.thinkingBudget"]
    assert parse().enable_thinking is None and not parse().include_thoughts
    level = parse(generationConfig={"thinkingConfig": {"thinkingLevel": "LOW"}})
    assert level.enable_thinking is True and level.ignored == [
        "generationConfig.thinkingConfig.thinkingLevel"
    ]
