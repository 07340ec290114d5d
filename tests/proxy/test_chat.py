"""The OpenAI surface against the dev engine, and what the log holds afterwards (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from openai import AsyncOpenAI, OpenAI
from sqlalchemy import text

from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK, TOOLS, clean_seed, step

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def _token_events(proxy: Harness, sid: str) -> list[Any]:
    with proxy.store.db.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT turn_index, token_id, logprob, loss_mask, policy_version FROM token_events "
                "WHERE session_id = :s AND loss_mask ORDER BY turn_index, position"
            ),
            {"s": sid},
        ).all()


def test_every_received_token_is_logged(proxy_any: Harness) -> None:
    proxy = proxy_any
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="ignored-when-the-url-has-a-token")
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=6, seed=3, logprobs=True)
    received = [(e.logprob) for e in r.choices[0].logprobs.content]
    stream = client.chat.completions.create(
        model="m", messages=[*MSGS, {"role": "user", "content": "Again"}], max_tokens=6, seed=3,
        logprobs=True, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    received += [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    usage = chunks[-1].usage
    rows = _token_events(proxy, s.session_id)
    assert len(rows) == len(received) == 12
    assert all(bool(row.loss_mask) for row in rows)
    assert np.allclose([row.logprob for row in rows], received, atol=1e-6)
    turns = proxy.store.turns.read(run, session_id=s.session_id)
    assert r.usage.completion_tokens == turns[0].generated_ids.size
    assert r.usage.prompt_tokens == turns[0].segment_offset + turns[0].context_ids.size
    assert usage.completion_tokens == turns[1].generated_ids.size
    assert usage.prompt_tokens == turns[1].segment_offset + turns[1].context_ids.size
    for t in turns:  # routed experts: n_ctx + n_gen - 1 rows for a segment's first turn
        assert t.routed_experts is not None
        assert t.routed_experts.shape[0] == t.context_ids.size + t.generated_ids.size - (
            t.segment_offset == 0
        )


def test_streaming_equals_non_streaming_for_the_same_seed(proxy: Harness) -> None:
    run = proxy.run()
    a, b = proxy.session(run), proxy.session(run)
    kw: dict[str, Any] = {"model": "m", "messages": MSGS, "max_tokens": 10, "seed": 7, "extra_body": NOTHINK}
    full = OpenAI(base_url=a.base_url, api_key="x").chat.completions.create(**kw)
    chunks = list(OpenAI(base_url=b.base_url, api_key="x").chat.completions.create(stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    ta, tb = (proxy.store.turns.read(run, session_id=x.session_id)[0] for x in (a, b))
    assert ta.generated_ids.tolist() == tb.generated_ids.tolist()
    assert np.array_equal(ta.logprobs, tb.logprobs)


def test_async_client_bearer_header_and_models(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)

    async def main() -> tuple[Any, Any, Any]:
        # Closed inside this loop: a client left for the garbage collector closes its sockets on
        # whatever loop runs then, which breaks a later test.
        async with AsyncOpenAI(base_url=f"{proxy.server.base_url}/v1", api_key=s.token) as client:
            models = await client.models.list()
            r = await client.chat.completions.create(model="m", messages=MSGS, max_tokens=5)
            parts = [
                c
                async for c in await client.chat.completions.create(
                    model="m", messages=MSGS, max_tokens=5, stream=True, seed=2
                )
            ]
        return models, r, parts

    models, r, parts = asyncio.run(main())
    assert models.data[0].id == "qwen3.5"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    assert parts[-1].choices[0].finish_reason == "length"
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 2


def test_retry_returns_the_recorded_reply_and_restart_continues(proxy: Harness) -> None:
    run = proxy.run()
    s = proxy.session(run)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    probe = OpenAI(base_url=proxy.session(run).base_url, api_key="x")
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Tools."}, {"role": "user", "content": "ls"}]
    kw: dict[str, Any] = {"model": "m", "max_tokens": 4, "tools": TOOLS, "extra_body": NOTHINK}
    kw["seed"] = clean_seed(probe, msgs, **{k: v for k, v in kw.items() if k != "model"})
    first = client.chat.completions.create(messages=msgs, **kw)
    again = client.chat.completions.create(messages=msgs, **kw)
    assert again.choices[0].message.content == first.choices[0].message.content
    keyed = dict(kw, extra_headers={"Idempotency-Key": "k1"}, max_tokens=3)
    k1 = client.chat.completions.create(messages=msgs, **keyed)
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 2
    proxy.restart()  # the proxy dies; a new one on the same log serves the agent's retries
    client = OpenAI(base_url=f"{proxy.server.base_url}/s/{s.token}/v1", api_key="x", max_retries=0)
    probe = OpenAI(base_url=proxy.session(run).base_url, api_key="x")
    assert client.chat.completions.create(messages=msgs, **keyed).usage == k1.usage
    replay = client.chat.completions.create(messages=msgs, **kw)
    assert replay.choices[0].message.content == first.choices[0].message.content
    assert len(proxy.store.turns.read(run, session_id=s.session_id)) == 2
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}]
    msgs += [{"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    step(client, probe, msgs)
    turns = proxy.store.turns.read(run, session_id=s.session_id)
    assert [t.turn_index for t in turns] == [0, 1, 2]
    assert turns[2].route == "append" and turns[2].parent_turn_id == turns[0].id
    assert turns[2].segment_index == turns[0].segment_index
