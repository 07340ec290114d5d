"""The dev engine's SGLang sampling breadth over real HTTP: constrained decoding (xgrammar),
penalties, top logprobs, and clear refusals of what it does not implement."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from dressage.engines import EngineClient, SamplingParams
from dressage.engines.grammar import GrammarBackend, GrammarSpec
from dressage.errors import EngineHTTPError, RequestError
from tests.dev_engine import RunningEngine

pytestmark = pytest.mark.anyio

PROMPT = [248045, 872, 198, 9707, 11, 1879, 0, 248046, 198, 248045, 74455, 198]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


async def test_json_schema_output_is_valid_json_of_the_schema(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        for seed in (0, 1):
            hot = SamplingParams(
                temperature=1.0, max_new_tokens=40, sampling_seed=seed, json_schema=json.dumps(SCHEMA)
            )
            r = await c.generate(PROMPT, hot)
            assert r.finish_reason.type == "stop" and r.finish_reason.matched == r.output_ids[-1]
            assert r.output_ids[-1] in engine.loaded.eos_token_ids  # the grammar allows only EOS at its end
            value = json.loads(r.text or "")
            assert set(value) == {"answer", "n"} and value["answer"] in ("yes", "no") and 0 <= value["n"] <= 9
            # Masked sampling: every returned logprob is that of an allowed token, finite.
            assert r.logprobs is not None and all(np.isfinite(r.logprobs))


async def test_regex_and_ebnf_constrain_greedy_and_sampled_output(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        free = await c.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=8))
        rx = await c.generate(
            PROMPT, SamplingParams(temperature=0, max_new_tokens=30, regex=r"(yes|no)-[0-9]{3}")
        )
        assert re.fullmatch(r"(yes|no)-[0-9]{3}", rx.text or "") and rx.finish_reason.type == "stop"
        assert rx.output_ids[:2] != free.output_ids[:2]  # the random model alone writes something else
        grammar = 'root ::= "The answer is " ("A" | "B" | "C") "."'
        for temperature in (0.0, 1.0):
            eb = await c.generate(
                PROMPT,
                SamplingParams(temperature=temperature, max_new_tokens=30, ebnf=grammar, sampling_seed=3),
            )
            assert re.fullmatch(r"The answer is [ABC]\.", eb.text or ""), eb.text


async def test_require_reasoning_defers_the_grammar_until_the_thinking_closes(engine: RunningEngine) -> None:
    thinking_prompt = [*PROMPT, 248068, 198]  # the assistant opens "<think>\n"
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    async with EngineClient(engine.url) as c:
        free = await c.generate(thinking_prompt, greedy)
        constrained = greedy.model_copy(update={"regex": "[0-9]+"})
        deferred = await c.generate(thinking_prompt, constrained, require_reasoning=True)
        direct = await c.generate(thinking_prompt, constrained)
    assert deferred.output_ids == free.output_ids  # no </think> yet: reasoning is unconstrained
    assert (direct.text or "").isdigit() and direct.output_ids != free.output_ids


def test_grammar_state_turns_on_after_the_think_end_tokens(engine: RunningEngine) -> None:
    loaded = engine.loaded
    backend = GrammarBackend(loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids)
    state = backend.compile(GrammarSpec("regex", "[0-9]"), require_reasoning=True).start()
    think_end = loaded.tokenizer.encode("</think>")
    logits = torch.zeros(loaded.vocab_size)
    state.mask(logits)
    assert torch.isfinite(logits).all()  # reasoning: nothing masked
    for token in [*loaded.tokenizer.encode("so "), *think_end]:
        state.accept(token)
    assert state.active
    state.mask(logits)
    allowed = torch.isfinite(logits).nonzero().flatten().tolist()
    assert sorted(loaded.tokenizer.decode([t]) for t in allowed) == [str(d) for d in range(10)]


async def test_penalties_follow_sglangs_formula(engine: RunningEngine) -> None:
    params = SamplingParams(
        temperature=0,
        max_new_tokens=10,
        frequency_penalty=-0.5,
        presence_penalty=-0.3,
        repetition_penalty=1.2,
    )
    async with EngineClient(engine.url) as c:
        plain = await c.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=10))
        r = await c.generate(PROMPT, params)
    # The random model's logits are nearly flat, so negative (rewarding) penalties make it repeat.
    assert r.output_ids != plain.output_ids and len(set(r.output_ids)) < len(set(plain.output_ids))
    # Reference: one full forward pass per step, penalties over the output so far (SGLang's penaltylib).
    ids: list[int] = []
    logprobs: list[float] = []
    with torch.inference_mode():
        for _ in range(10):
            logits = engine.loaded.model(input_ids=torch.tensor([PROMPT + ids])).logits[0, -1].float()
            counts = torch.zeros_like(logits)
            for t in ids:
                counts[t] += 1
            logits = logits + 0.5 * counts + 0.3 * (counts > 0).float()
            logits = torch.where(counts > 0, torch.where(logits < 0, logits * 1.2, logits / 1.2), logits)
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    assert r.output_ids == ids
    np.testing.assert_allclose(r.logprobs or [], logprobs, atol=1e-3)


async def test_top_logprobs_are_the_best_of_the_same_distribution(engine: RunningEngine) -> None:
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    async with EngineClient(engine.url) as c:
        r = await c.generate(PROMPT, greedy, top_logprobs_num=4)
        deltas = [d async for d in c.generate_stream(PROMPT, greedy, top_logprobs_num=4)]
        hot = SamplingParams(temperature=0.7, max_new_tokens=6, sampling_seed=5)
        h = await c.generate(PROMPT, hot, top_logprobs_num=3)
        none = await c.generate(PROMPT, greedy)
    assert none.top_logprobs is None
    assert r.top_logprobs is not None and len(r.top_logprobs) == len(r.output_ids)
    with torch.inference_mode():
        logits = engine.loaded.model(input_ids=torch.tensor([PROMPT + r.output_ids[:-1]])).logits[0].float()
    expected = torch.log_softmax(logits[len(PROMPT) - 1 :], -1).topk(4)
    for i, row in enumerate(r.top_logprobs):
        assert [t for t, _ in row] == expected.indices[i].tolist()
        np.testing.assert_allclose([lp for _, lp in row], expected.values[i].numpy(), atol=1e-4)
        assert row[0] == (r.output_ids[i], pytest.approx((r.logprobs or [])[i]))
    streamed = [row for d in deltas for row in d.top_logprobs or []]
    assert streamed == r.top_logprobs
    # Sampling: the alternatives come from the tempered distribution the token's logprob comes from.
    assert h.top_logprobs is not None and h.logprobs is not None
    for token, lp, row in zip(h.output_ids, h.logprobs, h.top_logprobs, strict=True):
        assert [v for _, v in row] == sorted((v for _, v in row), reverse=True)
        assert lp <= row[0][1] + 1e-6
        assert token not in dict(row) or dict(row)[token] == pytest.approx(lp)


async def test_what_it_does_not_implement_is_refused(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        cases = [
            (SamplingParams(max_new_tokens=2, regex="a", json_schema="{}"), "Only one of regex"),
            (SamplingParams(max_new_tokens=2, regex="(unclosed"), "invalid regex"),
            (SamplingParams(max_new_tokens=2, json_schema="{not json"), "invalid json_schema"),
            (SamplingParams(max_new_tokens=2, ebnf="root ::= undefined_rule"), "invalid ebnf"),
            (SamplingParams(max_new_tokens=2, n=2), "send n requests"),  # type: ignore[call-arg]
            (SamplingParams(max_new_tokens=2, structural_tag="{}"), "structural_tag"),  # type: ignore[call-arg]
            (SamplingParams(max_new_tokens=2, logit_bias={"1": 2.0}), "logit_bias"),  # type: ignore[call-arg]
        ]
        for params, message in cases:
            with pytest.raises(EngineHTTPError, match=re.escape(message)) as info:
                await c.generate(PROMPT, params)
            assert info.value.status_code == 400
        with pytest.raises(EngineHTTPError, match="top_logprobs_num needs return_logprob"):
            await c.generate(
                PROMPT, SamplingParams(max_new_tokens=2), return_logprob=False, top_logprobs_num=2
            )
        # The neutral values of the unimplemented params are accepted.
        ok = await c.generate(PROMPT, SamplingParams(max_new_tokens=2, n=1, min_new_tokens=0))  # type: ignore[call-arg]
        assert len(ok.output_ids) == 2


def test_grammar_spec_refuses_two_grammars() -> None:
    with pytest.raises(RequestError, match="Only one of"):
        GrammarSpec.from_sampling(SamplingParams(regex="a", ebnf='root ::= "a"'))
    assert GrammarSpec.from_sampling(SamplingParams()) is None
    assert GrammarSpec.from_sampling(SamplingParams(regex="a")) == GrammarSpec("regex", "a")
