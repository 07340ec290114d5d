"""The engine supervisor's bookkeeping against real HTTP servers on loopback (fast; the kill -9
drills with dev engines and worker processes are in ``test_engine_failover.py``).

Two servers answer ``/health`` as two engines given by URL: one stops answering, so after two probe
intervals it is dead, the pool gives new sessions (and the sessions pinned to it) to the other, and
an episode that started before asks ``faulted_since`` and learns an engine died; the other stops
too, and with no engine left (neither is the worker's to restart) ``lost`` is set.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dressage.engines import EnginePool
from dressage.rollout.engine_health import EngineSupervisor, is_engine_fault


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


class _Engine:
    """A loopback server answering ``/health`` until :meth:`stop`."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def engines() -> Iterator[list[_Engine]]:
    started = [_Engine(), _Engine()]
    yield started
    for e in started:
        e.stop()


async def _until(pred: object, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_dead_engine_gets_no_sessions_and_losing_all_sets_lost(engines: list[_Engine]) -> None:
    async def go() -> None:
        pool = EnginePool([e.url for e in engines], timeout=5.0)
        pinned = pool.client_for("s0").base_url
        assert pinned == engines[0].url
        async with EngineSupervisor(pool, probe_s=0.05) as sup:
            mark = sup.mark()
            await sup.probe()
            assert sup.available and sup.faults == 0 and not await sup.faulted_since(mark)

            engines[0].stop()
            await _until(lambda: sup.faults == 1)
            assert await sup.faulted_since(mark)
            assert sup.available and not sup.lost.is_set()
            assert {pool.client_for(f"new{i}").base_url for i in range(3)} == {engines[1].url}
            assert pool.client_for("s0").base_url == engines[1].url  # the pinned session moves

            engines[1].stop()
            await asyncio.wait_for(sup.lost.wait(), 30)
            assert not sup.available and sup.faults == 2
            loss = sup.describe_loss()
            assert f"the engine at {engines[0].url} died (/health unanswered)" in loss
            assert loss.count("is not this worker's to restart") == 2
            line = str(sup.lost_error("r1", 5))
            assert "\n" not in line
            assert line.endswith("5 pairs are left to play: resume with dressage-worker rollout --resume r1")
        await pool.aclose()

    asyncio.run(go())


def test_engine_fault_wording_matches_the_client_and_the_pool() -> None:
    assert is_engine_fault(
        "agent a crashed: InternalServerError: Error code: 502 - engine at http://h:1/generate is unreachable "
        "(ConnectError: refused); check that the engine is running and the URL is right"
    )
    assert is_engine_fault("Error code: 502 - no healthy engine among ['http://h:1']; start one")
    assert not is_engine_fault("agent a crashed: RuntimeError: boom")
    assert not is_engine_fault(None)
