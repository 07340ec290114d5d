"""Inside slime: ``generate_rollout`` with ``--dressage-config`` places dressage's workers and one proxy
per SGLang engine as actors in slime's Ray cluster, then serves slime steps from what they play.

The CPU part of that path: the 3-node test cluster (this process is connected as slime's rollout
manager is), the CPU dev engine in place of an SGLang server (it speaks SGLang's protocol), a
loopback stand-in for slime's router answering ``GET /workers`` as sglang_router does, and
``tests/training/fake_slime`` (slime's ``Sample`` and rollout-output types) on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from dressage.integrations.slime import generate_rollout, slime_engine_urls, stop_rollout_actors
from dressage.rollout.engine_process import DevEngineProcess
from tests.cluster.conftest import REPO, RayTestCluster, quickstart_config
from tests.cluster.test_ray_rollout import assert_exactly_once, sessions_of
from tests.rollout.conftest import requires_bwrap

pytestmark = [pytest.mark.slow, pytest.mark.postgres, requires_bwrap, pytest.mark.timeout(600)]

FAKE_SLIME = REPO / "tests" / "training" / "fake_slime"


@pytest.fixture
def slime_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``import slime`` finds the stand-in for this test only."""
    monkeypatch.syspath_prepend(str(FAKE_SLIME))
    yield
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """A dev engine and a router stand-in listing it: ``(router ip, router port, engine url)``."""
    engine = DevEngineProcess("tiny", seed=0)
    url = asyncio.run(engine.start())

    class Workers(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"workers": [{"url": url, "worker_type": "regular"}]}).encode()
            self.send_response(200 if self.path == "/workers" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Workers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield "127.0.0.1", server.server_address[1], url
    finally:
        server.shutdown()
        engine.stop()


def test_slimes_rollout_function_places_workers_next_to_its_engines(
    ray_cluster: RayTestCluster,
    cluster_pg_url: str,
    tmp_path: Path,
    slime_on_path: None,
    router: tuple[str, int, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ip, port, engine_url = router
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    config = quickstart_config(tmp_path, limit=4)
    run = config.read_text().split("run: ")[1].split()[0]
    args = SimpleNamespace(
        sglang_router_ip=ip,
        sglang_router_port=port,
        dressage_config=str(config),
        dressage_database_url=cluster_pg_url,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        global_batch_size=4,
    )
    assert slime_engine_urls(args) == [engine_url]
    try:
        steps = [generate_rollout(args, k, None) for k in (0, 1)]
    finally:
        stop_rollout_actors()
    for out in steps:
        assert len(out.samples) == 2 and all(len(group) == 2 for group in out.samples)
    served = {s.session_id for out in steps for group in out.samples for s in group}
    rows = sessions_of(cluster_pg_url, tmp_path / "home", run)
    assert_exactly_once(rows, 8)
    assert served == {r.id for r in rows if r.status == "finished"}
    assert all(r.info.get("ray_node_id") for r in rows)
