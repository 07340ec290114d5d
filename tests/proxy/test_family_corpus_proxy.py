"""Every family's corpus through the real proxy (HTTP, official client, SQLite log): what the proxy
recorded, turn by turn, equals the independent reference (official template + shipped vocabulary,
or Mistral's own encoder).

The scripted engine generates each assistant turn of the corpus in the family's output form; the
agent sends the corpus' next request. The recorded turns are read back from the log and each
turn's prompt is rebuilt from its segment (earlier turns' context and generated ids, then its own
context ids) and compared with the reference ids of that request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai import OpenAI

from dressage.store import EventStore, Turn
from dressage.tito.profiles import get_profile
from tests.proxy.conftest import Harness, LoopThread
from tests.scripted_engine import ScriptedEngine
from tests.tito.family_corpus import CONVERSATIONS
from tests.tito.family_harness import mismatch_count, request_points
from tests.tito.references import deepseek_reference, mistral_reference, qwen36_reference
from tests.tito.test_deepseek import deepseek_output
from tests.tito.test_mistral import mistral_output
from tests.tito.test_qwen36 import qwen_output

FAMILIES: dict[str, tuple[Callable[..., list[int]], Callable[..., str], bool | None]] = {
    "qwen3.6": (qwen36_reference(False), qwen_output, None),
    "deepseek-v3": (deepseek_reference, deepseek_output, None),
    "mistral-nemo": (mistral_reference, mistral_output, None),
}
CORPUS = [c for c in CONVERSATIONS if c[0] != "long_context"]  # long_context: covered in tests/tito


def prompts_from_log(turns: list[Turn]) -> list[list[int]]:
    """Each turn's prompt ids, rebuilt from its segment in the log (turns in recording order)."""
    segments: dict[int, list[int]] = {}
    prompts = []
    for t in turns:
        before = segments.get(t.segment_index, []) if t.route != "create" else []
        assert len(before) == t.segment_offset, "a turn continues its segment where the last one ended"
        prompt = [*before, *(int(i) for i in t.context_ids)]
        prompts.append(prompt)
        segments[t.segment_index] = [*prompt, *(int(i) for i in t.generated_ids)]
    return prompts


@pytest.mark.parametrize("profile_name", sorted(FAMILIES))
def test_corpus_through_the_proxy_is_token_exact(
    loop_thread: LoopThread, sqlite_store: EventStore, profile_name: str
) -> None:
    reference, model_output, thinking = FAMILIES[profile_name]
    profile = get_profile(profile_name)
    end = profile.turn_end_token
    pending: list[str] = []
    engine = ScriptedEngine(
        lambda prompt, n, sampling: pending.pop(0), profile=profile_name, max_context=1 << 20
    )
    with engine.running() as eng:
        proxy = Harness(loop_thread, sqlite_store, eng.url, profile=profile_name, context_window=1 << 20)
        try:
            requests = tokens = mismatches = 0
            for name, messages, tools in CORPUS:
                s = proxy.session(proxy.run())
                client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
                wants = []
                for k in request_points(messages):
                    prefix = messages[:k]
                    reply = messages[k] if k < len(messages) else {"role": "assistant", "content": "ok"}
                    pending.append(model_output(profile, prefix, reply, tools, thinking).removesuffix(end))
                    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
                    client.chat.completions.create(model="m", messages=prefix, max_tokens=4096, **kwargs)
                    wants.append(reference(prefix, tools, thinking))
                turns = proxy.store.turns.read(session_id=s.session_id, with_experts=False)
                got = prompts_from_log(turns)
                assert len(got) == len(wants), name
                for g, w in zip(got, wants, strict=True):
                    bad = mismatch_count(g, w)
                    assert bad == 0, f"{profile_name} {name}: {bad} token mismatches"
                    mismatches += bad
                    tokens += len(w)
                requests += len(wants)
            assert mismatches == 0 and requests >= 50 and tokens > 10_000
        finally:
            loop_thread.call(proxy.server.stop())


def test_streaming_follows_the_family_reasoning_rules(
    loop_thread: LoopThread, sqlite_store: EventStore
) -> None:
    """Mistral has no reasoning: '</think>' in its text is content, streamed or not; a DeepSeek
    stream splits reasoning at '</think>' and holds its tool calls back for the final chunk."""
    replies = {"mistral-nemo": "a </think> b", "deepseek-v3": "why</think>so"}
    for name, text in replies.items():
        with ScriptedEngine(lambda prompt, n, sampling, text=text: text, profile=name).running() as eng:
            proxy = Harness(loop_thread, sqlite_store, eng.url, profile=name)
            try:
                client = OpenAI(base_url=proxy.session(proxy.run()).base_url, api_key="x", max_retries=0)
                msgs: list[Any] = [{"role": "user", "content": "Hi"}]
                whole = client.chat.completions.create(model="m", messages=msgs).choices[0].message
                chunks = list(client.chat.completions.create(model="m", messages=msgs, stream=True))
                streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                reasoning = "".join(
                    getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
                )
                assert streamed == whole.content
                if name == "mistral-nemo":
                    assert whole.content == "a </think> b" and reasoning == ""
                else:
                    assert whole.content == "so" and reasoning == "why"
            finally:
                loop_thread.call(proxy.server.stop())
