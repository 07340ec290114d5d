"""``--push-to``: a torch step pushed to a real dev engine on loopback, directly and through the proxy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_module

torch = require_module("torch", "the torch backend needs the 'engine' extra")
require_module("transformers", "the torch backend needs the 'engine' extra")

import httpx  # noqa: E402
from sqlalchemy import select  # noqa: E402

from dressage.config import Settings  # noqa: E402
from dressage.engines.protocol import SamplingParams  # noqa: E402
from dressage.engines.sglang_client import EngineClient  # noqa: E402
from dressage.engines.tiny_model import LoadedModel, load_model  # noqa: E402
from dressage.errors import ConfigError, TrainingError  # noqa: E402
from dressage.store import EventStore  # noqa: E402
from dressage.store import schema as t  # noqa: E402
from dressage.training import StepOptions, Trainer  # noqa: E402
from dressage.training.torch_backend import TorchBackend  # noqa: E402
from dressage.training.weight_push import WeightPusher, parse_urls  # noqa: E402
from tests.dev_engine import free_port, serve_dev_engine  # noqa: E402
from tests.training.builders import build_run, simple  # noqa: E402

PROMPT = [11, 22, 33, 44, 55]
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def served() -> LoadedModel:
    """The model the dev engine serves (its parameters are compared with the pushed ones)."""
    return load_model("tiny", seed=0)


@pytest.fixture(scope="module")
def engine_url(served: LoadedModel) -> Iterator[str]:
    """A dev engine serving the ``tiny`` model (seed 0, the trainer's initial weights) in a thread."""
    torch.set_num_threads(1)
    with serve_dev_engine(served, seed=0, start_timeout_s=60) as url:
        yield url


def probe(url: str) -> tuple[str | None, list[float]]:
    """The engine's weight version and the greedy logprobs of a fixed prompt."""

    async def go() -> tuple[str | None, list[float]]:
        async with EngineClient(url) as client:
            info = await client.model_info()
            out = await client.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=4))
            return info.weight_version, list(out.logprobs or [])

    return asyncio.run(go())


def recorded_versions(store: EventStore, run: str) -> dict[int, str | None]:
    """The run's rows of the ``policy_versions`` table."""
    r = store.runs.get(run)
    c = t.policy_versions.c
    with store.db.read() as conn:
        rows = conn.execute(select(c.version, c.checkpoint_uri).where(c.run_id == r.id)).all()
    return {row.version: row.checkpoint_uri for row in rows}


def train_one_step(
    store: EventStore, run: str, out: Path, pusher: WeightPusher, initial_version: int
) -> dict:
    build_run(store, run, [[simple(1.0), simple(0.0)]])
    # a random 248k-vocabulary model has ~1/V logit gradients: a large SGD step makes the change visible
    backend = TorchBackend(out, model="tiny", lr=2000.0, push=pusher)
    options = StepOptions(2, 2, initial_version=initial_version)
    [result] = Trainer(store, run, options, backend).run_steps()
    return result.metrics


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_push_to_engine_directly(
    store: EventStore, run_name: str, tmp_path: Path, engine_url: str, served: LoadedModel
) -> None:
    from safetensors.torch import load_file

    version_before, logprobs_before = probe(engine_url)
    metrics = train_one_step(store, run_name, tmp_path / "out", WeightPusher(store, [engine_url]), 0)
    assert metrics["pushed_version"] == 1.0
    version_after, logprobs_after = probe(engine_url)  # also shows generation was continued
    assert (version_before, version_after) == ("0", "1")
    assert max(abs(a - b) for a, b in zip(logprobs_before, logprobs_after, strict=False)) > 1e-4
    hf_dir = tmp_path / "out" / "hf-v000001"
    trained = load_file(str(tmp_path / "out" / "step-000001.safetensors"))
    served_state = served.model.state_dict()
    assert all(torch.equal(served_state[k], v) for k, v in trained.items())  # the engine serves step 1
    assert (hf_dir / "config.json").is_file() and list(hf_dir.glob("*.safetensors"))
    assert recorded_versions(store, run_name) == {1: hf_dir.resolve().as_uri()}
    assert store.versions.latest(run_name) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_push_through_proxy_admin_api(
    store: EventStore, run_name: str, tmp_path: Path, engine_url: str
) -> None:
    """Two proxies on one log (a ``proxy.urls`` deployment): both paused, the engine loaded, both resumed."""
    from dressage.proxy.server import ProxyServer

    settings = Settings(
        database_url=str(store.db.engine.url), home=tmp_path / "home", admin_token=ADMIN_TOKEN
    )
    proxies = [ProxyServer(store, [engine_url], settings=settings) for _ in range(2)]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    for proxy in proxies:
        asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(timeout=60)
    urls = [proxy.base_url for proxy in proxies]
    try:
        with pytest.raises(TrainingError, match="refused the admin token"):
            WeightPusher(store, [engine_url], proxy_admin_urls=urls, admin_token="wrong").push(
                store.runs.create(f"{run_name}-x"), 7, tmp_path
            )
        assert [httpx.get(f"{url}/health").json()["paused"] for url in urls] == [False, False]
        pusher = WeightPusher(store, [engine_url], proxy_admin_urls=urls, admin_token=ADMIN_TOKEN)
        metrics = train_one_step(store, run_name, tmp_path / "out", pusher, initial_version=4)
        assert metrics["pushed_version"] == 5.0
        assert probe(engine_url)[0] == "5"
        # every proxy tags new tokens with the pushed version
        assert [proxy.coordinator.version for proxy in proxies] == [5, 5]
        assert [httpx.get(f"{url}/health").json()["paused"] for url in urls] == [False, False]
        assert set(recorded_versions(store, run_name)) == {5}
    finally:
        for proxy in proxies:
            asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_push_errors_name_the_url(store: EventStore, run_name: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    run = store.runs.create(run_name)
    with pytest.raises(TrainingError, match=f"pause_generation failed on {dead}"):
        WeightPusher(store, [dead]).push(run, 1, tmp_path)
    with pytest.raises(TrainingError, match=f"admin API at {dead}/admin/pause is unreachable"):
        WeightPusher(store, [dead], proxy_admin_urls=[dead], admin_token="x").push(run, 1, tmp_path)
    assert recorded_versions(store, run_name) == {}
    with pytest.raises(ConfigError, match="DRESSAGE_ADMIN_TOKEN"):
        WeightPusher(store, [dead], proxy_admin_urls=[dead], admin_token="")
    with pytest.raises(ConfigError, match="not an http"):
        parse_urls("127.0.0.1:30000")
    assert parse_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
