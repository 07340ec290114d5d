"""Forced tool calls, client disconnects mid-stream, and stop strings across a pause/resume seam."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from openai import OpenAI

from dressage.tito import get_profile
from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK, TOOLS, abandon_mid_stream, clean_seed

MSGS = [{"role": "system", "content": "Tools."}, {"role": "user", "content": "List the files."}]
NAMED = {"type": "function", "function": {"name": "ls"}}


def _encode(text: str) -> list[int]:
    return get_profile("qwen3.5").tokenizer.encode(text)


def test_named_tool_choice_forces_the_opening_as_context(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    msgs: list[dict[str, Any]] = [*MSGS]
    r = client.chat.completions.create(
        model="m", messages=msgs, tools=TOOLS, tool_choice=NAMED, max_tokens=6, seed=1, extra_body=NOTHINK
    )
    forced = _encode("<tool_call>\n<function=ls>\n")
    turn = proxy.store.turns.read(run, session_id=s.session_id)[0]
    # The opening is context (not sampled: no logprob, never trained); the engine continued it.
    assert turn.context_ids.tolist()[-len(forced) :] == forced
    assert turn.generated_ids.size == 6 and bool(turn.loss_mask.all())
    assert turn.info["forced_tool_call"] == "ls" and turn.info["tito"]["forced"] == len(forced)
    assert r.usage.prompt_tokens == turn.context_ids.size and r.usage.completion_tokens == 6
    # Contract: the random model never closes the call within max_tokens -> finish "length", no
    # tool_calls, the raw text from the opening on as content, the failure recorded on the turn.
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert (choice.message.content or "").startswith("<tool_call>\n<function=ls>\n")
    assert [f["reason"] for f in turn.info["tool_call_failures"]] == ["unclosed_tool_call"]
    # The record matches what the next request renders: the agent sends the text back, and the
    # turn appends in the same segment (forced ids included in the lineage, token-exactly).
    content = choice.message.content or ""
    if content == content.rstrip():
        msgs += [{"role": "assistant", "content": content}, {"role": "tool", "content": "a.txt"}]
        client.chat.completions.create(
            model="m", messages=msgs, max_tokens=2, tools=TOOLS, extra_body=NOTHINK
        )
        nxt = proxy.store.turns.read(run, session_id=s.session_id)[1]
        assert (nxt.route, nxt.segment_index) == ("append", turn.segment_index)


def test_forced_call_parses_when_closed_and_thinking_closes_empty(proxy: Harness) -> None:
    """The reply side of the contract, on the real tokenizer and parser: a closed call parses."""
    from dressage.proxy.dialects.chat import parse_chat_request
    from dressage.proxy.replies import parse_reply, reply_text

    profile = get_profile("qwen3.5")
    body = {"messages": MSGS, "tools": TOOLS, "tool_choice": NAMED}
    req = parse_chat_request(httpx.Request("POST", "/", json=body).content)
    prefix = profile.forced_tool_call_prefix("ls", True)
    assert prefix == "\n</think>\n\n<tool_call>\n<function=ls>\n"
    # what the template renders for an assistant turn with empty reasoning that only calls ls
    rendered = profile.render([*MSGS, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}]}], TOOLS, False, True)  # fmt: skip
    prompt = profile.render(MSGS, TOOLS, True, True)
    assert rendered.startswith(prompt + prefix)
    rest = [
        *_encode("<parameter=path>\n.\n</parameter>\n</function>\n</tool_call>"),
        profile.stop_token_ids[0],
    ]
    text = reply_text(profile, _encode(prefix), rest, None)
    parsed = parse_reply(profile, req, text, "t")
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["ls"] and not parsed.failures
    # tool_choice none: a call the model writes anyway stays content, never a tool call
    none = parse_chat_request(httpx.Request("POST", "/", json={**body, "tool_choice": "none"}).content)
    assert not parse_reply(profile, none, text, "t").tool_calls


def test_required_tool_choice_with_one_tool_forces_its_name_and_streams(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=4, seed=2,
            stream=True, extra_body=NOTHINK,
        )
    )  # fmt: skip
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.startswith("<tool_call>\n<function=ls>\n")
    assert chunks[-1].choices[0].finish_reason == "length"
    turn = proxy.store.turns.read(run, session_id=s.session_id)[0]
    forced = _encode("<tool_call>\n<function=ls>\n")
    assert turn.context_ids.tolist()[-len(forced) :] == forced and turn.generated_ids.size == 4


@pytest.mark.parametrize("choice", ["required", NAMED])
@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_with_thinking_on_thinks_first_and_max_tokens_ends_in_the_reasoning(
    proxy: Harness, choice: object, stream: bool
) -> None:
    """SGLang's and vLLM's shape: the call is forced by a grammar after ``</think>``, not prefilled.

    The random model never closes its thinking, so ``max_tokens`` ends inside it: the reply is the
    partial reasoning, ``content`` null, no tool call, ``finish_reason`` ``length``.
    """
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    kw: dict[str, Any] = {
        "model": "m", "messages": MSGS, "tools": TOOLS, "tool_choice": choice, "max_tokens": 5, "seed": 3,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": True}},
    }  # fmt: skip
    if stream:
        chunks = list(client.chat.completions.create(**kw, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        assert not "".join(d.content or "" for d in deltas) and not any(d.tool_calls for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.chat.completions.create(**kw)
        msg = r.choices[0].message
        assert msg.content is None and not msg.tool_calls
        reasoning, finish = msg.reasoning_content, r.choices[0].finish_reason  # type: ignore[attr-defined]
    assert reasoning and finish == "length"
    turn = proxy.store.turns.read(run, session_id=s.session_id)[0]
    prompt = get_profile("qwen3.5").render(MSGS, TOOLS, True, True)
    assert turn.context_ids.tolist() == _encode(prompt)  # nothing forced into the prompt
    assert turn.generated_ids.size == 5 and turn.loss_mask.all()  # every token sampled, trained
    assert '"ls"' in turn.sampling_params["ebnf"] and "<tool_call>" in turn.sampling_params["ebnf"]


def test_client_disconnect_mid_stream_records_the_partial_turn_and_retry_generates_anew(
    proxy: Harness,
) -> None:
    run = proxy.run()
    # a seed whose 5-token reply re-renders exactly (checked below: the next turn appends to it),
    # found in a probe session
    probe = OpenAI(base_url=proxy.session(run).base_url, api_key="x", max_retries=0)
    seed = clean_seed(probe, MSGS, max_tokens=5, extra_body=NOTHINK)
    s = proxy.session(run)
    abandon_mid_stream(proxy.server.base_url, s.token, MSGS, seed)  # the client goes away mid-stream
    deadline = time.monotonic() + 30
    while not (turns := proxy.store.turns.read(run, session_id=s.session_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(turns) == 1, "the abandoned turn was not recorded"
    aborted = turns[0]
    assert aborted.finish_reason == "abort" and aborted.info["client_disconnected"] is True
    assert aborted.info["tito"] == {"aborted": True}
    assert 3 <= aborted.generated_ids.size < 200  # every token received, nothing invented
    assert aborted.logprobs.size == aborted.generated_ids.size and not aborted.loss_mask.any()  # untrained
    assert (aborted.route, aborted.boundary_reason) == ("create", "client_disconnected")
    # The same request again (same idempotency key): a fresh generation, not a replay of the part.
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=5, seed=seed, extra_headers={"Idempotency-Key": "turn-1"},
        extra_body=NOTHINK,
    )  # fmt: skip
    turns = proxy.store.turns.read(run, session_id=s.session_id)
    assert len(turns) == 2 and r.usage.completion_tokens == 5
    retry = turns[1]
    assert retry.finish_reason == "length" and retry.route == "create" and retry.boundary_reason is None
    assert retry.thread_index == 0 and retry.segment_index != aborted.segment_index
    # the retry's lineage goes on as one segment: the next tool-loop turn (a tool result; a new user
    # query would start a segment, Qwen3.5 dropping the reasoning block) appends to it. The reply must
    # re-render exactly (the template strips surrounding whitespace): the probe's seed gives one that does.
    content = r.choices[0].message.content or ""
    assert content and content == content.strip(), (
        f"seed {seed}'s reply {content!r} does not re-render exactly"
    )
    nxt = [*MSGS, {"role": "assistant", "content": content}]
    nxt.append({"role": "tool", "tool_call_id": "call_1", "content": "a.txt"})
    client.chat.completions.create(model="m", messages=nxt, max_tokens=2, extra_body=NOTHINK)
    last = proxy.store.turns.read(run, session_id=s.session_id)[-1]
    assert (last.route, last.segment_index, last.parent_turn_id) == ("append", retry.segment_index, retry.id)
    # a restarted proxy rebuilds the session without the abandoned turn in its lineages
    proxy.restart()
    client = OpenAI(base_url=f"{proxy.server.base_url}/s/{s.token}/v1", api_key="x", max_retries=0)
    again = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=5, seed=seed, extra_headers={"Idempotency-Key": "turn-1"},
        extra_body=NOTHINK,
    )  # fmt: skip
    assert again.choices[0].message.content == r.choices[0].message.content  # replayed, not regenerated
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 3


def test_stop_string_spanning_a_pause_resume_seam_stops_generation(proxy: Harness) -> None:
    """A generation interrupted after 5 tokens continues; a stop string across the seam ends it.

    Greedy decoding makes the continuation equal to the uninterrupted generation, so the seam
    lands exactly between tokens 5 and 6 (a pause racing the engine would not be deterministic).
    """
    import asyncio

    from dressage.engines import EngineClient, EnginePool, SamplingParams
    from dressage.proxy.generation import Coordinator, Generation

    tok = get_profile("qwen3.5").tokenizer
    prompt = tok.encode("<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n")

    async def generate(stop: list[str] | None, ids: list[int], lps: list[float], stream: bool) -> Generation:
        pool = EnginePool([proxy.engine_url])
        client = EngineClient(proxy.engine_url)
        gen = Generation(
            Coordinator(pool), client, prompt, SamplingParams(max_new_tokens=20, temperature=0, stop=stop),
            rid="seam-test", ids=list(ids), logprobs=list(lps), versions=[0] * len(ids),
            resumes=1 if ids else 0, decode=tok.decode,
        )  # fmt: skip
        try:
            if stream:
                async for _ in gen.stream():
                    pass
            else:
                await gen.run()
        finally:
            await client.aclose()
            await pool.aclose()
        return gen

    whole = asyncio.run(generate(None, [], [], False))  # uninterrupted, no stop
    ids = whole.ids
    head, full = tok.decode(ids[:5]), tok.decode(ids[:6])
    stop = head[-2:] + full[len(head) :][:2]
    assert len(stop) >= 3 and stop not in head and whole.finish and whole.finish.type == "length"
    for stream in (True, False):
        gen = asyncio.run(generate([stop], ids[:5], whole.logprobs[:5], stream))
        assert gen.finish is not None and (gen.finish.type, gen.finish.matched) == ("stop", stop)
        n = len(gen.ids)  # cut right after the token completing the stop string, nothing after it
        assert gen.ids == ids[:n] and stop in tok.decode(gen.ids) and stop not in tok.decode(gen.ids[:-1])
        assert n < 20 and len(gen.logprobs) == len(gen.versions) == n
    # the record equals an uninterrupted generation with the same stop string
    alone = asyncio.run(generate([stop], [], [], False))
    assert alone.ids == gen.ids and alone.finish is not None and alone.finish.matched == stop


def test_max_tokens_inside_the_thinking_answers_the_partial_reasoning_in_every_dialect(
    proxy: Harness,
) -> None:
    """SGLang / vLLM / Anthropic: the partial reasoning is the reply; finish ``length`` / ``max_tokens``."""
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=4, extra_body={"chat_template_kwargs": {"enable_thinking": True}}
    )
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content is None
    assert chat.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    resp = client.responses.create(model="m", input="hi", max_output_tokens=4, reasoning={"effort": "high"})
    assert (
        resp.status == "incomplete"
        and resp.incomplete_details
        and resp.incomplete_details.reason == "max_output_tokens"
    )
    assert [item.type for item in resp.output] == ["reasoning"] and resp.output_text == ""
    assert resp.usage and resp.usage.output_tokens_details.reasoning_tokens == resp.usage.output_tokens == 4
    import anthropic  # here, not at the top: only this test's xdist worker pays the import

    a = anthropic.Anthropic(base_url=s.base_url.removesuffix("/v1"), api_key="x", max_retries=0)
    msg = a.messages.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content] == ["thinking"]
    assert msg.content[0].thinking  # type: ignore[union-attr]
    gemini = httpx.post(
        f"{s.base_url.removesuffix('/v1')}/v1beta/models/m:generateContent",
        json={
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {
                "maxOutputTokens": 4,
                "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 1024},
            },
        },
        timeout=60,
    ).json()
    [candidate] = gemini["candidates"]
    parts = candidate["content"]["parts"]
    assert candidate["finishReason"] == "MAX_TOKENS" and parts[0].get("thought") and parts[0]["text"]
    assert "".join(p.get("text", "") for p in parts if not p.get("thought")) == ""  # no answer, only thoughts
    usage = gemini["usageMetadata"]
    assert usage["thoughtsTokenCount"] == 4 and usage.get("candidatesTokenCount", 0) == 0, usage


def test_responses_truncation_disabled_and_auto_are_served_by_the_context_window_path(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    for value in ("disabled", "auto"):
        r = client.responses.create(
            model="m",
            input="hi",
            max_output_tokens=2,
            truncation=value,
            reasoning={"effort": "none"},  # type: ignore[arg-type]
        )
        assert r.truncation == value
    default = client.responses.create(
        model="m", input="hi", max_output_tokens=2, reasoning={"effort": "none"}
    )
    assert default.truncation == "disabled"
    turns = proxy.store.turns.read(run, session_id=s.session_id)
    assert [t.info.get("truncation") for t in turns] == ["disabled", "auto", None]
    # An input over the context window is refused either way (never cut: the prompt is the agent's).
    huge = "word " * 5000  # over the 4096-token window, under the body limit
    for value in ("disabled", "auto"):
        r2 = httpx.post(
            s.base_url + "/responses", headers={"Authorization": "Bearer x"},
            json={"model": "m", "input": huge, "max_output_tokens": 2, "truncation": value}, timeout=120,
        )  # fmt: skip
        assert r2.status_code == 400 and r2.json()["error"]["code"] == "context_length_exceeded", r2.text
    bad = httpx.post(s.base_url + "/responses", json={"model": "m", "input": "hi", "truncation": "middle"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation"
