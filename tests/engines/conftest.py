"""Fixtures: real dev engines on loopback ports (uvicorn in a thread), shared by the session."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch", reason="the dev engine needs the 'engine' extra (torch, transformers)")
pytest.importorskip("transformers", reason="the dev engine needs the 'engine' extra (torch, transformers)")

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from dressage.engines.dev_engine import create_app  # noqa: E402
from dressage.engines.tiny_model import LoadedModel, load_model  # noqa: E402


@dataclass
class RunningEngine:
    """A dev engine serving on ``url`` and the model it serves (for direct forward passes)."""

    url: str
    loaded: LoadedModel


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_dev_engine(loaded: LoadedModel, seed: int, *, start_timeout_s: float = 30) -> Iterator[str]:
    """Serve ``loaded`` with the dev engine on a free loopback port (uvicorn in a thread); yield its URL.

    JSON-schema output is compact (SGLang's ``--constrained-json-disable-any-whitespace``): the
    random tiny model would otherwise spend its token budget on whitespace the grammar allows.
    """
    port = free_port()
    app = create_app(loaded, seed=seed, constrained_json_disable_any_whitespace=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:
        raise RuntimeError(f"dev engine at {url} did not come up")
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def _serve(seed: int) -> Iterator[RunningEngine]:
    loaded = load_model("tiny", seed=seed)
    with serve_dev_engine(loaded, seed) as url:
        yield RunningEngine(url=url, loaded=loaded)


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def engine() -> Iterator[RunningEngine]:
    """The main dev engine (tiny model, seed 0)."""
    yield from _serve(seed=0)


@pytest.fixture(scope="session")
def engine_b() -> Iterator[RunningEngine]:
    """A second dev engine, for pools and weight updates."""
    yield from _serve(seed=0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
