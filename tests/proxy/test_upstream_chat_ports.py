r"""SGLang's and vLLM's own OpenAI-server chat-completions tests, re-expressed against the proxy.

Each test here re-states the request and the assertions of an upstream test (read from
sgl-project/sglang ``test/srt/openai_server/...`` and vllm-project/vllm
``tests/entrypoints/openai/chat_completion/test_chat.py``), sent with the official ``openai``
client to a real proxy on SQLite in front of the CPU dev engine (tiny random Qwen3.5-MoE, xgrammar
constrained decoding). Only assertions about *what a real model writes* are left out (a random
model answers nothing sensible); everything about the protocol, the constraint, the shapes and
the counts is kept. Where an upstream constraint leaves free text open (SGLang's regex ``[\w]+`` /
``[\d]+``, its JSON schema's free name and integer, its EBNF ``[A-Za-z]+``), the port bounds that
part (``{1,8}``, ``maximum``): a random-weight model never chooses to end free text, so the
unbounded form only measures the token budget; the bounded form still fails if the constraint is
not enforced. vLLM's ``json_object`` requests run greedy for the same reason. Thinking is off (``enable_thinking: false``) unless a test is about reasoning,
since the random model never closes a thinking block.

Ported from SGLang (``test/srt/openai_server/``):

- ``basic/test_openai_server.py`` ``TestOpenAIServer``: ``test_chat_completion`` (logprobs None/5
  x n 1/2), ``test_chat_completion_stream`` (same grid), ``test_regex``, ``test_penalty``,
  ``test_model_list``, ``test_retrieve_model``.
- ``features/test_json_constrained.py`` (``JSONConstrainedMixin.test_json_openai``):
  ``response_format`` ``json_schema``.
- ``features/test_json_mode.py``: ``test_json_mode_response``, ``test_json_mode_with_streaming``.
- ``features/test_openai_server_ebnf.py``: ``test_ebnf``, ``test_ebnf_strict_json``.
- ``features/test_reasoning_content.py`` / ``test_enable_thinking.py``: reasoning arrives as
  ``reasoning_content`` (and here also ``reasoning``) with thinking on, in replies and in every
  streamed delta; with thinking off there is none.

Ported from vLLM (``tests/entrypoints/openai/chat_completion/test_chat.py``):
``test_no_logprobs_chat``, ``test_zero_logprobs_chat``, ``test_some_logprobs_chat``,
``test_too_many_chat_logprobs``, ``test_single_chat_session``, ``test_chat_streaming``,
``test_chat_completion_stream_options`` (include_usage off/on, stream options without stream
refused), ``test_structured_outputs_choice_chat``, ``test_structured_outputs_regex_chat``,
``test_structured_outputs_type_error``, ``test_structured_outputs_choice_chat_logprobs``,
``test_response_format_json_object``, ``test_response_format_json_schema``,
``test_response_format_text``, ``test_extra_fields_allowed``, ``test_complex_message_content``,
``test_long_seed``, ``test_chat_completion_n_parameter_non_streaming``,
``test_chat_completion_n_parameter_streaming``, ``test_chat_completion_n_with_seed``,
``test_chat_completion_n_equals_1``; plus ``max_model_len`` on model entries (a forced tool
call's ``content`` ``""`` and both reasoning keys are checked on a scripted engine that closes its
call and its thinking, in ``tests/proxy/test_chat_breadth.py``).

Left out, and why:

- Assertions on what a real model writes: vLLM's ``{"result": 2}`` answers, ``content == "2"``,
  ``choice1 != choice2`` / ``ip1 != ip2`` / different name and age on a second request, the
  "cannot lead to valid JSON without a schema" half of ``test_response_format_json_schema``;
  SGLang's ``test_response_prefill`` expected text; the exact ``prompt_tokens=37`` of vLLM's
  model (here checked against the log's own count instead).
- vLLM's ``test_structured_outputs_json_chat``: its employee schema has unbounded free-text
  fields that a random-weight model fills to the token budget before closing them (the
  ``json_schema`` path itself is covered by SGLang's ``test_json_openai`` and vLLM's
  ``test_response_format_json_schema`` here).
- Features this proxy does not serve: the legacy ``/v1/completions`` route (SGLang's
  ``test_completion*``; Dressage is a chat / messages / responses proxy), SGLang's Responses and
  rerank classes (the Responses dialect has its own tests), vLLM's ``prompt_logprobs``,
  ``/invocations``, LoRA model names, ``min_tokens`` / ``min_characters`` and
  ``continuous_usage_stats`` (refused: asserted below), and custom message roles (refused with
  400, asserted below, where vLLM passes them to its template).
- vLLM's pydantic wording in ``test_long_seed`` (the 400 is asserted, the message differs).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant"}
FRANCE = [SYSTEM, {"role": "user", "content": "What is the capital of France? Answer in a few words."}]
ONE_PLUS_ONE = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is 1+1?"},
]
THINK_OFF: dict[str, Any] = {"extra_body": NOTHINK}
IP_REGEX = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"  # vLLM's sample_regex


@pytest.fixture
def client(proxy: Harness) -> Iterator[OpenAI]:
    """The official client on a fresh session of a proxy on SQLite."""
    session = proxy.session(proxy.run())
    with OpenAI(base_url=session.base_url, api_key="sk-123456") as c:
        c.session_id = session.session_id  # type: ignore[attr-defined]
        yield c


def _extra(**body: Any) -> dict[str, Any]:
    return {"extra_body": {**NOTHINK, **body}}


# --- SGLang: basic/test_openai_server.py --------------------------------------------------------


def test_sglang_chat_completion(client: OpenAI) -> None:
    for logprobs in (None, 5):
        for n in (1, 2):
            r = client.chat.completions.create(
                model="m", messages=FRANCE, temperature=0, max_tokens=6, n=n,
                logprobs=logprobs is not None and logprobs > 0, top_logprobs=logprobs, **THINK_OFF,
            )  # fmt: skip
            if logprobs:
                content = r.choices[0].logprobs.content  # type: ignore[union-attr]
                assert isinstance(content[0].top_logprobs[0].token, str)  # type: ignore[index]
                assert len(content[0].top_logprobs) == logprobs  # type: ignore[index]
            assert len(r.choices) == n
            assert r.choices[0].message.role == "assistant"
            assert isinstance(r.choices[0].message.content, str)
            assert r.id and r.created
            assert r.usage is not None and r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
            assert r.usage.total_tokens > 0


def test_sglang_chat_completion_stream(client: OpenAI) -> None:
    for logprobs in (None, 5):
        for n in (1, 2):
            stream = client.chat.completions.create(
                model="m", messages=[*FRANCE[:1], {"role": "user", "content": "What is the capital of France?"}],
                temperature=0, max_tokens=6, n=n, logprobs=logprobs is not None and logprobs > 0,
                top_logprobs=logprobs, stream=True, stream_options={"include_usage": True}, **THINK_OFF,
            )  # fmt: skip
            is_firsts: dict[int, bool] = {}
            finished: dict[int, bool] = {}
            finish_counts: dict[int, int] = defaultdict(int)
            usage_seen = False
            for response in stream:
                if response.usage is not None:
                    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
                    assert response.usage.total_tokens > 0
                    usage_seen = True
                    continue
                index = response.choices[0].index
                if response.choices[0].finish_reason is not None:
                    finished[index] = True
                    finish_counts[index] += 1
                data = response.choices[0].delta
                if is_firsts.get(index, True):
                    assert data.role == "assistant"
                    is_firsts[index] = False
                    continue
                if logprobs and not finished.get(index, False):
                    lp = response.choices[0].logprobs
                    assert lp is not None and lp.content
                    assert isinstance(lp.content[0].top_logprobs[0].token, str)
                    assert isinstance(lp.content[0].top_logprobs, list)
                    assert len(lp.content[0].top_logprobs) == logprobs
                assert (
                    isinstance(data.content, str)
                    or isinstance(getattr(data, "reasoning_content", None), str)
                    or (isinstance(data.tool_calls, list) and len(data.tool_calls) > 0)
                    or response.choices[0].finish_reason
                )
                assert response.id and response.created
            assert usage_seen
            for index in range(n):
                assert not is_firsts.get(index, True), f"index {index} is not found in the response"
                assert finish_counts[index] == 1


def test_sglang_regex(client: OpenAI) -> None:
    # SGLang's regex with the two open repeats bounded ({1,8}): a random model never ends a free word.
    regex = r"""\{\n""" + r"""   "name": "[\w]{1,8}",\n""" + r"""   "population": [\d]{1,8}\n""" + r"""\}"""
    r = client.chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": "Introduce the capital of France."}],
        temperature=0, max_tokens=128, **_extra(regex=regex),
    )  # fmt: skip
    js_obj = json.loads(r.choices[0].message.content or "")
    assert isinstance(js_obj["name"], str)
    assert isinstance(js_obj["population"], int)


def test_sglang_penalty(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": "Introduce the capital of France."}],
        temperature=0, max_tokens=8, frequency_penalty=1.0, **THINK_OFF,
    )  # fmt: skip
    assert isinstance(r.choices[0].message.content, str)


def test_sglang_model_list_and_retrieve(client: OpenAI) -> None:
    models = list(client.models.list())
    assert len(models) == 1
    assert isinstance(getattr(models[0], "max_model_len", None), int)
    retrieved = client.models.retrieve(models[0].id)
    assert retrieved.id == models[0].id
    assert retrieved.root == models[0].id  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("non-existent-model")


# --- SGLang: features/ ---------------------------------------------------------------------------

JSON_SCHEMA = {  # SGLang's schema, name and population bounded (a random model never ends free ones)
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[\\w]{1,8}$"},
        "population": {"type": "integer", "minimum": 0, "maximum": 99_999_999},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}


def test_sglang_json_openai(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=[SYSTEM, {"role": "user", "content": "Introduce the capital of France. Return in a JSON format. "
                                                       "The JSON Schema is: " + json.dumps(JSON_SCHEMA)}],
        temperature=0, max_tokens=128,
        response_format={"type": "json_schema", "json_schema": {"name": "foo", "schema": JSON_SCHEMA}},
        **THINK_OFF,
    )  # fmt: skip
    js_obj = json.loads(r.choices[0].message.content or "")
    assert isinstance(js_obj["name"], str)
    assert isinstance(js_obj["population"], int)


BULGARIA = [
    {"role": "system", "content": "You are a helpful AI assistant that gives a short answer."},
    {"role": "user", "content": "What is the capital of Bulgaria?"},
]


def test_sglang_json_mode_response_and_streaming(client: OpenAI) -> None:
    kw: dict[str, Any] = {"temperature": 0, "max_tokens": 128, "response_format": {"type": "json_object"}}
    r = client.chat.completions.create(model="m", messages=BULGARIA, **kw, **THINK_OFF)
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    stream = client.chat.completions.create(model="m", messages=BULGARIA, stream=True, **kw, **THINK_OFF)
    full = "".join(c.choices[0].delta.content for c in stream if c.choices[0].delta.content is not None)
    assert isinstance(json.loads(full), dict)
    assert full == r.choices[0].message.content  # same prompt, greedy: the same constrained answer


def test_sglang_ebnf(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "You are a helpful EBNF test bot."},
                  {"role": "user", "content": "Say a greeting (Hello, Hi, or Hey)."}],
        temperature=0, max_tokens=32, **_extra(ebnf='root ::= "Hello" | "Hi" | "Hey"'),
    )  # fmt: skip
    text = (r.choices[0].message.content or "").strip()
    assert len(text) > 0
    assert re.match(r"^(Hello|Hi|Hey)[.!?]*\s*$", text), text
    strict = r"""
        root    ::= "{" pair "}"
        pair    ::= "\"name\"" ":" string
        string  ::= "\"" [A-Za-z]{1,8} "\""
        """  # SGLang's grammar with the letters bounded to 8
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "EBNF mini-JSON generator."},
                  {"role": "user", "content": "Generate single key JSON with only letters."}],
        temperature=0, max_tokens=64, **_extra(ebnf=strict),
    )  # fmt: skip
    text = (r.choices[0].message.content or "").strip()
    assert re.match(r'^\{"name":"[A-Za-z]{1,8}"\}$', text), text


def test_sglang_reasoning_content_with_thinking_on_and_off(client: OpenAI) -> None:
    on = {"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}
    r = client.chat.completions.create(model="m", messages=FRANCE, temperature=0, max_tokens=6, **on)
    msg = r.choices[0].message
    assert isinstance(msg.reasoning_content, str) and msg.reasoning_content  # type: ignore[attr-defined]
    assert msg.reasoning == msg.reasoning_content  # type: ignore[attr-defined]
    stream = client.chat.completions.create(
        model="m", messages=FRANCE, temperature=0, max_tokens=6, stream=True, **on
    )
    deltas = [c.choices[0].delta for c in stream][1:]  # after the role chunk
    assert deltas and all(d.model_extra is not None for d in deltas)
    for d in deltas:  # the keys are in every delta, null when the delta has no reasoning
        assert "reasoning_content" in d.model_extra and "reasoning" in d.model_extra  # type: ignore[operator]
    streamed = "".join(d.reasoning_content or "" for d in deltas)  # type: ignore[attr-defined]
    assert streamed == msg.reasoning_content  # type: ignore[attr-defined]
    off = client.chat.completions.create(model="m", messages=FRANCE, temperature=0, max_tokens=6, **THINK_OFF)
    assert getattr(off.choices[0].message, "reasoning_content", None) is None


# --- vLLM: chat_completion/test_chat.py ----------------------------------------------------------


def test_vllm_logprobs_none_zero_some_and_too_many(client: OpenAI) -> None:
    base: dict[str, Any] = {
        "model": "m",
        "messages": ONE_PLUS_ONE,
        "max_completion_tokens": 5,
        "temperature": 0.0,
    }
    r = client.chat.completions.create(**base, logprobs=False, **THINK_OFF)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(**base, logprobs=True, top_logprobs=0, **THINK_OFF)
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 0
    r = client.chat.completions.create(**base, logprobs=True, top_logprobs=5, **THINK_OFF)
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 5
    with pytest.raises((openai.BadRequestError, openai.APIError)):
        for _ in client.chat.completions.create(
            model="m",
            messages=ONE_PLUS_ONE,
            max_completion_tokens=10,
            logprobs=True,
            top_logprobs=21,
            stream=True,
        ):
            pass
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=ONE_PLUS_ONE, max_completion_tokens=10, logprobs=True, top_logprobs=30
        )
    after = client.chat.completions.create(
        model="m", messages=ONE_PLUS_ONE, max_completion_tokens=10, **THINK_OFF
    )
    assert after.choices[0].message.content is not None


def test_vllm_single_chat_session(client: OpenAI, proxy: Harness) -> None:
    messages: list[dict[str, Any]] = list(ONE_PLUS_ONE)
    r = client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=5, logprobs=True, top_logprobs=5, **THINK_OFF
    )
    assert r.id is not None and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    turn = proxy.store.turns.read(session_id=client.session_id)[0]  # type: ignore[attr-defined]
    prompt = turn.segment_offset + turn.context_ids.size
    assert r.usage == openai.types.CompletionUsage(
        completion_tokens=5, prompt_tokens=prompt, total_tokens=prompt + 5
    )
    assert choice.message.content is not None and choice.message.role == "assistant"
    messages += [{"role": "assistant", "content": choice.message.content},
                 {"role": "user", "content": "express your result in json"}]  # fmt: skip
    r = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=5, **THINK_OFF)
    assert r.choices[0].message.content is not None


def test_vllm_chat_streaming(client: OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": "m",
        "messages": ONE_PLUS_ONE,
        "max_completion_tokens": 10,
        "temperature": 0.0,
    }
    r = client.chat.completions.create(**kw, **THINK_OFF)
    output, stop_reason = r.choices[0].message.content, r.choices[0].finish_reason
    chunks: list[str] = []
    finish_reason_count = 0
    for chunk in client.chat.completions.create(**kw, stream=True, **THINK_OFF):
        delta = chunk.choices[0].delta
        if delta.role:
            assert delta.role == "assistant"
        if delta.content:
            chunks.append(delta.content)
        if chunk.choices[0].finish_reason is not None:
            finish_reason_count += 1
    assert finish_reason_count == 1  # the finish reason only in the last chunk
    assert chunk.choices[0].finish_reason == stop_reason
    assert delta.content  # the last chunk carries the last text
    assert "".join(chunks) == output


def test_vllm_chat_completion_stream_options(client: OpenAI) -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
    kw: dict[str, Any] = {"model": "m", "messages": messages, "max_completion_tokens": 10, "temperature": 0.0}
    for chunk in client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": False}, **THINK_OFF
    ):
        assert chunk.usage is None
    stream = client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}, **THINK_OFF
    )
    seen_final = False
    for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason is None:
            assert chunk.usage is None
        elif chunk.choices:
            assert chunk.usage is None
            final = next(stream)
            assert (
                final.usage is not None
                and final.usage.prompt_tokens > 0
                and final.usage.completion_tokens > 0
            )
            assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
            assert final.choices == []
            seen_final = True
    assert seen_final
    for opts in ({"include_usage": None}, {"include_usage": True}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**kw, stream=False, stream_options=opts)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="usage in every chunk"):
        client.chat.completions.create(
            **kw,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )


CHOICES = ["Python", "Java", "JavaScript", "C++", "C#", "PHP", "TypeScript", "Ruby", "Swift", "Kotlin"]
LANGUAGE = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "The best language for type-safe systems programming is "},
]


def test_vllm_structured_outputs_choice_and_logprobs(client: OpenAI) -> None:
    messages: list[dict[str, Any]] = list(LANGUAGE)
    so = _extra(structured_outputs={"choice": CHOICES})
    r = client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=10, temperature=0.7, **so
    )
    choice1 = r.choices[0].message.content
    assert choice1 in CHOICES
    messages += [
        {"role": "assistant", "content": choice1},
        {"role": "user", "content": "I disagree, pick another one"},
    ]
    r = client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=10, temperature=0.7, **so
    )
    assert r.choices[0].message.content in CHOICES
    r = client.chat.completions.create(
        model="m", messages=LANGUAGE, max_completion_tokens=10, logprobs=True, top_logprobs=5, **so
    )
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert len(top) == 5
    for item in top:  # -9999.0 is the minimum logprob OpenAI reports (masked tokens included)
        assert item.logprob >= -9999.0, top


def test_vllm_structured_outputs_regex_and_type_error(client: OpenAI) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "you are a helpful assistant"},
        {"role": "user", "content": f"Give an example IP address with this regex: {IP_REGEX}"},
    ]
    so = _extra(structured_outputs={"regex": IP_REGEX})
    ip1 = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=20, **so)
    text1 = ip1.choices[0].message.content
    assert text1 is not None and re.fullmatch(IP_REGEX, text1) is not None
    messages += [
        {"role": "assistant", "content": text1},
        {"role": "user", "content": "Give me a different one"},
    ]
    ip2 = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=20, **so)
    text2 = ip2.choices[0].message.content
    assert text2 is not None and re.fullmatch(IP_REGEX, text2) is not None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m",
            messages=LANGUAGE,
            extra_body={"structured_outputs": {"regex": {1: "Python", 2: "C++"}}},
        )


def test_vllm_response_format_json_object_schema_and_text(client: OpenAI) -> None:
    user = [
        {
            "role": "user",
            "content": 'what is 1+1? please respond with a JSON object, the format is {"result": 2}',
        }
    ]
    for _ in range(2):
        r = client.chat.completions.create(  # greedy here: sampled, a random model writes keys without end
            model="m", messages=user, max_completion_tokens=128, temperature=0,
            response_format={"type": "json_object"}, **THINK_OFF,
        )  # fmt: skip
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    schema = {"type": "object", "properties": {"result": {"type": "integer"}}}
    for _ in range(2):
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": 'what is 1+1? The format is "result": 2'}],
            max_completion_tokens=128,
            response_format={"type": "json_schema", "json_schema": {"name": "foo_test", "schema": schema}},
            **THINK_OFF,
        )  # fmt: skip
        loaded = json.loads(r.choices[0].message.content or "")
        assert isinstance(loaded, dict) and set(loaded) <= {"result"}
        assert all(isinstance(v, int) for v in loaded.values())
    for _ in range(2):
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "what is 1+1?"}], max_completion_tokens=10,
            response_format={"type": "text"}, **THINK_OFF,
        )  # fmt: skip
        assert r.choices[0].message.content is not None


def test_vllm_extra_fields_complex_content_roles_and_long_seed(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "what is 1+1?", "extra_field": "0"}],  # type: ignore[misc,list-item]
        temperature=0, seed=0, max_completion_tokens=4, **THINK_OFF,
    )  # fmt: skip
    assert r.choices[0].message.content is not None
    parts = [{"type": "text", "text": "what is 1+1? please provide the result without any other text."}]
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
        temperature=0, seed=0, max_completion_tokens=4, **THINK_OFF,
    )  # fmt: skip
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="role"):  # vLLM renders custom roles; refused here
        client.chat.completions.create(
            model="m",
            messages=[{"role": "my-custom-role", "content": "what is 1+1?"}],  # type: ignore[misc,list-item]
        )
    for seed in (-(1 << 63) - 1, (1 << 63)):
        with pytest.raises(openai.BadRequestError, match="seed"):
            client.chat.completions.create(
                model="m", messages=[{"role": "system", "content": "You are a helpful assistant."}],
                temperature=0, seed=seed,
            )  # fmt: skip


def test_vllm_n_parameter(client: OpenAI, proxy: Harness) -> None:
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the opposite of big?"}]  # fmt: skip
    r = client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=8, temperature=0.7, n=3, **THINK_OFF
    )
    assert len(r.choices) == 3
    for i, choice in enumerate(r.choices):
        assert choice.index == i
        assert choice.message.content is not None and len(choice.message.content) > 0
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage is not None
    turns = proxy.store.turns.read(session_id=client.session_id)  # type: ignore[attr-defined]
    assert r.usage.completion_tokens == sum(t.generated_ids.size for t in turns) == 3 * 8
    chunks_by_index: dict[int, list[str]] = defaultdict(list)
    for chunk in client.chat.completions.create(
        model="m", messages=[messages[0], {"role": "user", "content": "What is the capital of France?"}],
        max_completion_tokens=6, temperature=0.7, n=2, stream=True, **THINK_OFF,
    ):  # fmt: skip
        for c in chunk.choices:
            if c.delta.content:
                chunks_by_index[c.index].append(c.delta.content)
    assert "".join(chunks_by_index[0]) and "".join(chunks_by_index[1])
    seeded = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hello."}], max_completion_tokens=6,
        temperature=0.8, n=2, seed=42, **THINK_OFF,
    )  # fmt: skip
    assert len(seeded.choices) == 2
    for i, choice in enumerate(seeded.choices):
        assert choice.index == i and choice.message.content
    one = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], max_completion_tokens=6, temperature=0.7, n=1,
        **THINK_OFF,
    )  # fmt: skip
    assert len(one.choices) == 1 and one.choices[0].index == 0 and one.choices[0].message.content is not None


def test_vllm_model_entry_has_max_model_len(client: OpenAI) -> None:
    url = str(client.base_url).rstrip("/") + "/models"
    entry = httpx.get(url, headers={"Authorization": "Bearer x"}).json()["data"][0]
    assert entry["max_model_len"] == 4096  # the harness's context window
