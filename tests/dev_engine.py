"""The dev engine served on a free loopback port by uvicorn in a thread of the test process.

Imported by the ``engine`` fixture (tests/conftest.py) and the tests that serve engines of their own;
it needs the 'engine' extra (torch, transformers).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import uvicorn

from dressage.engines.dev_engine import create_app
from dressage.engines.tiny_model import LoadedModel, load_model


@dataclass
class RunningEngine:
    """A dev engine serving on ``url`` and the model it serves (for direct forward passes)."""

    url: str
    loaded: LoadedModel


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def serve_tiny_engine(seed: int) -> Iterator[RunningEngine]:
    """The tiny model (``seed``) served until the generator is closed (a fixture's body)."""
    loaded = load_model("tiny", seed=seed)
    with serve_dev_engine(loaded, seed) as url:
        yield RunningEngine(url=url, loaded=loaded)
