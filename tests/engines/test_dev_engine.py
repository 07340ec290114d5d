"""The CPU dev engine driven over real HTTP by EngineClient."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from dressage.engines import EngineClient, SamplingParams
from dressage.engines.tiny_model import RouterCapture
from tests.dev_engine import RunningEngine

pytestmark = pytest.mark.anyio

PROMPT = [248045, 872, 198, 9707, 11, 1879, 0, 248046, 198, 248045, 74455, 198]
GREEDY = SamplingParams(temperature=0, max_new_tokens=16)


async def test_greedy_and_seeded_sampling_are_deterministic(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        a = await c.generate(PROMPT, GREEDY)
        b = await c.generate(PROMPT, GREEDY)
        assert a.output_ids == b.output_ids and len(a.output_ids) == 16
        assert a.finish_reason.type == "length"
        hot = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=12, sampling_seed=11)
        s1, s2 = await c.generate(PROMPT, hot), await c.generate(PROMPT, hot)
        s3 = await c.generate(PROMPT, hot.model_copy(update={"sampling_seed": 12}))
        assert s1.output_ids == s2.output_ids != s3.output_ids


async def test_logprobs_match_a_direct_forward_pass(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        r = await c.generate(PROMPT, GREEDY)
    assert r.logprobs is not None and len(r.logprobs) == len(r.output_ids)
    assert all(np.isfinite(lp) and lp <= 0 for lp in r.logprobs)
    ids = torch.tensor([PROMPT + r.output_ids[:-1]])
    with torch.inference_mode():
        logits = engine.loaded.model(input_ids=ids).logits[0].float()
    expected = torch.log_softmax(logits[len(PROMPT) - 1 :], dim=-1)
    expected = expected[torch.arange(len(r.output_ids)), torch.tensor(r.output_ids)]
    np.testing.assert_allclose(r.logprobs, expected.numpy(), atol=1e-4)
    assert r.output_ids == logits[len(PROMPT) - 1 :].argmax(-1).tolist()


async def test_routed_experts_shape_and_values(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        r = await c.generate(PROMPT, GREEDY, return_routed_experts=True)
        info = await c.model_info()
    experts = r.routed_experts
    assert experts is not None and experts.dtype == np.int32
    assert experts.shape == (len(PROMPT) + len(r.output_ids) - 1, info.num_layers, info.top_k) == (27, 2, 2)
    assert experts.min() >= 0 and experts.max() < (info.num_experts or 0)
    capture = RouterCapture(engine.loaded.model)
    rows: list[np.ndarray] = []
    capture.begin(rows)
    with torch.inference_mode():
        engine.loaded.model(input_ids=torch.tensor([PROMPT + r.output_ids[:-1]]))
    capture.end()
    direct = np.sort(rows[0], axis=-1)
    assert np.array_equal(np.sort(experts[: len(PROMPT)], axis=-1), direct[: len(PROMPT)])
    assert (np.sort(experts, axis=-1) == direct).all(axis=(1, 2)).mean() > 0.9


async def test_routed_experts_start_len_trims_the_rows(engine: RunningEngine) -> None:
    start = 7
    async with EngineClient(engine.url) as c:
        full = await c.generate(PROMPT, GREEDY, return_routed_experts=True)
        tail = await c.generate(PROMPT, GREEDY, return_routed_experts=True, routed_experts_start_len=start)
        deltas = [
            d
            async for d in c.generate_stream(
                PROMPT, GREEDY, return_routed_experts=True, routed_experts_start_len=start
            )
        ]
        with pytest.raises(ValueError, match="routed_experts_start_len"):
            await c.generate(PROMPT, GREEDY, return_routed_experts=True, routed_experts_start_len=-1)
        with pytest.raises(ValueError, match="routed_experts_start_len"):
            await c.generate(PROMPT, GREEDY, routed_experts_start_len=len(PROMPT) + 1)
    assert tail.output_ids == full.output_ids
    assert full.routed_experts is not None and tail.routed_experts is not None
    assert tail.routed_experts.shape[0] == full.routed_experts.shape[0] - start
    assert np.array_equal(tail.routed_experts, full.routed_experts[start:])
    assert deltas[-1].routed_experts is not None
    assert np.array_equal(deltas[-1].routed_experts, full.routed_experts[start:])


async def test_stream_yields_the_same_tokens(engine: RunningEngine) -> None:
    params = SamplingParams(temperature=0.9, max_new_tokens=10, sampling_seed=5)
    async with EngineClient(engine.url) as c:
        whole = await c.generate(PROMPT, params, return_routed_experts=True)
        deltas = [d async for d in c.generate_stream(PROMPT, params, return_routed_experts=True)]
    assert [t for d in deltas for t in d.output_ids] == whole.output_ids
    assert [lp for d in deltas for lp in d.logprobs or []] == whole.logprobs
    assert all(len(d.output_ids) == 1 for d in deltas)
    assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
    assert deltas[-1].routed_experts is not None and whole.routed_experts is not None
    assert np.array_equal(deltas[-1].routed_experts, whole.routed_experts)


async def test_abort_mid_stream_keeps_partial_output(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        got: list[int] = []
        last = None
        async for d in c.generate_stream(
            PROMPT, SamplingParams(temperature=0, max_new_tokens=2000), rid="abort-me"
        ):
            got += d.output_ids
            last = d
            if len(got) == 3:
                await c.abort("abort-me")
        assert last is not None and last.finish_reason is not None and last.finish_reason.type == "abort"
        assert 3 <= len(got) < 2000 and last.completion_tokens == len(got)
        greedy = await c.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=len(got)))
        assert greedy.output_ids == got


async def test_pause_abort_mode_ends_requests_and_holds_new_ones(engine: RunningEngine) -> None:
    async with EngineClient(engine.url) as c:
        long = asyncio.create_task(c.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=2000)))
        await asyncio.sleep(0.2)
        await c.pause("abort")
        try:
            r = await asyncio.wait_for(long, 10)
            assert r.aborted and 0 < len(r.output_ids) < 2000
            held = asyncio.create_task(c.generate(PROMPT, GREEDY))
            done, _ = await asyncio.wait({held}, timeout=0.2)  # held while paused: not answered
            assert not done
        finally:
            await c.continue_()
        assert (await asyncio.wait_for(held, 10)).finish_reason.type == "length"


async def test_pause_in_place_then_continue_resumes_the_stream(engine: RunningEngine) -> None:
    params = SamplingParams(temperature=0.8, max_new_tokens=40, sampling_seed=9)
    async with EngineClient(engine.url) as c:
        reference = await c.generate(PROMPT, params)
        got: list[int] = []
        stream = c.generate_stream(PROMPT, params)
        async for d in stream:
            got += d.output_ids
            if len(got) == 5:
                await c.pause("in_place")
                break
        await asyncio.sleep(0.3)
        await c.continue_()
        async for d in stream:
            got += d.output_ids
            final = d
    assert final.finish_reason is not None and final.finish_reason.type == "length"
    assert got == reference.output_ids


async def test_errors_are_translated(engine: RunningEngine) -> None:
    from dressage.errors import EngineError, EngineHTTPError
    from tests.dev_engine import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    async with EngineClient(dead) as c:
        with pytest.raises(EngineError, match=dead):
            await c.generate(PROMPT, GREEDY)
        assert await c.health() is False
    async with EngineClient(engine.url) as c:
        for bad_ids, bad_params in [([], GREEDY), ([10**7], GREEDY), (PROMPT, SamplingParams(top_k=0))]:
            with pytest.raises(EngineHTTPError) as info:
                await c.generate(bad_ids, bad_params)
            assert info.value.status_code == 400
        resp = await c._http.post("/generate", json={"input_ids": "nope"})
        assert resp.status_code == 400 and "error" in resp.json()
        with pytest.raises(EngineHTTPError):
            await c.update_weights_from_disk("/nonexistent/weights")
