"""Weight updates (outputs, versions, per-token version spans) and the session-sticky pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dressage.engines import EngineClient, EnginePool, SamplingParams
from dressage.engines.tiny_model import build_tiny_model
from dressage.errors import EngineError
from tests.dev_engine import RunningEngine, free_port

pytestmark = pytest.mark.anyio

PROMPT = [248045, 872, 198, 9707, 248046, 198, 248045, 74455, 198]
GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Tiny-model checkpoints (HF dirs with safetensors) for seeds 0 and 1."""
    out = {}
    for seed in (0, 1):
        path = tmp_path_factory.mktemp(f"tiny-seed{seed}")
        build_tiny_model(seed).save_pretrained(path)
        out[seed] = path
    return out


async def test_update_weights_changes_outputs_and_version(
    engine_b: RunningEngine, checkpoints: dict[int, Path]
) -> None:
    async with EngineClient(engine_b.url) as c:
        before = await c.generate(PROMPT, GREEDY)
        answer = await c.update_weights_from_disk(str(checkpoints[1]), weight_version=1)
        assert answer.success
        after = await c.generate(PROMPT, GREEDY)
        assert after.output_ids != before.output_ids and after.weight_version == "1"
        assert (await c.model_info()).weight_version == "1"
        await c.update_weights_from_disk(str(checkpoints[0]), weight_version=2)
        again = await c.generate(PROMPT, GREEDY)
        assert again.output_ids == before.output_ids and again.weight_version == "2"


async def test_a_turn_can_span_weight_versions(engine_b: RunningEngine, checkpoints: dict[int, Path]) -> None:
    async with EngineClient(engine_b.url) as c:
        got: list[int] = []
        stream = c.generate_stream(PROMPT, SamplingParams(temperature=0, max_new_tokens=12))
        async for d in stream:
            got += d.output_ids
            if len(got) == 4:
                await c.pause("in_place")
                break
        await c.update_weights_from_disk(str(checkpoints[0]), weight_version="7")
        await c.continue_()
        async for d in stream:
            final = d
    spans = [(s.version, s.start, s.end) for s in final.weight_versions or []]
    assert spans[-1] == ("7", spans[-1][1], 12) and spans[0][1] == 0 and len(spans) == 2
    assert spans[0][2] == spans[1][1]  # contiguous: every token has exactly one version
    # The engine may have produced a few more tokens between the 4th reaching us and the pause
    # (more on a loaded machine); what matters is that the switch is at or after the pause point
    # and before the end, so the turn really spans two versions.
    assert 4 <= spans[1][1] < 12


async def test_pool_is_session_sticky_and_broadcasts(engine: RunningEngine, engine_b: RunningEngine) -> None:
    pool = EnginePool([engine.url, engine_b.url])
    try:
        first = {key: pool.client_for(key).base_url for key in ("s1", "s2", "s3", "s4")}
        assert set(first.values()) == {engine.url, engine_b.url}
        for _ in range(3):
            for key, url in first.items():
                assert pool.client_for(key).base_url == url
        r = await pool.generate("s1", PROMPT, GREEDY)
        assert r.finish_reason.type == "length"
        kw = {"return_routed_experts": True, "routed_experts_start_len": 3}
        trimmed = await pool.generate("s1", PROMPT, GREEDY, **kw)
        assert trimmed.routed_experts is not None
        assert trimmed.routed_experts.shape[0] == len(PROMPT) + len(trimmed.output_ids) - 1 - 3
        last = [d async for d in pool.generate_stream("s1", PROMPT, GREEDY, **kw)][-1]
        assert last.routed_experts is not None and last.routed_experts.shape == trimmed.routed_experts.shape
        await pool.pause("in_place")
        await pool.continue_()
        pool.mark_unhealthy(first["s1"])
        assert pool.client_for("s1").base_url != first["s1"]
        assert (await pool.check_health()) == {engine.url: True, engine_b.url: True}
    finally:
        await pool.aclose()
    dead = EnginePool([engine.url, f"http://127.0.0.1:{free_port()}"])
    try:
        health = await dead.check_health()
        assert list(health.values()) == [True, False]
        assert {dead.client_for(k).base_url for k in ("a", "b", "c")} == {engine.url}
        with pytest.raises(EngineError, match="1 of 2 engines"):
            await asyncio.wait_for(dead.continue_(), 10)
    finally:
        await dead.aclose()
