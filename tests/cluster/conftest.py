"""A 3-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), each node with its own resources.

Every node is pinned to 127.0.0.1, and ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set before Ray is
imported, inherited by the nodes, the actors and the ``--ray`` driver subprocesses) makes Ray
resolve ``127.0.0.1:PORT`` to 127.0.0.1 too: otherwise a node advertises the machine's outward
address and a driver connecting to ``127.0.0.1:PORT`` can time out on a machine whose outward
address is not routable. CPU requests are fractional: the machine has two shared cores.

Nodes: ``head`` (``engine_host``: the dev engine and its proxy go there, and ``sandbox_host``),
``node-2`` and ``node-3`` (``sandbox_host``): each has one rollout worker actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dressage.config import Settings
from dressage.store import EventStore
from tests.conftest import create_pg_database

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray is imported: see above
try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # the ray extra is not installed: the cluster fixture skips
    ray = None

REPO = Path(__file__).resolve().parents[2]
PG_DB = "dressage_cluster_test"
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}


@dataclass
class RayTestCluster:
    """The cluster and its nodes by name."""

    cluster: Any
    nodes: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_id(self, name: str) -> str:
        return str(self.nodes[name].node_id)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayTestCluster]:
    """Three nodes with their own resources; the test process is connected as a driver."""
    if ray is None:
        pytest.skip("Ray is not installed (pip install 'dressage[ray]')")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **NODE,
            "include_dashboard": False,
            "resources": {"engine_host": 1, "sandbox_host": 1},
        },
    )
    nodes = {"head": cluster.head_node}
    for name in ("node-2", "node-3"):
        nodes[name] = cluster.add_node(**NODE, resources={"sandbox_host": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield RayTestCluster(cluster, nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def cluster_pg_url() -> str:
    """A fresh, migrated PostgreSQL database for these tests."""
    return create_pg_database(PG_DB)


def open_store(url: str, home: Path) -> EventStore:
    """The log at ``url`` with artifacts under ``home``."""
    return EventStore.open(settings=Settings(database_url=url, home=home))


def quickstart_config(tmp: Path, *, limit: int = 6, **overrides: Any) -> Path:
    """examples/quickstart.yaml made small (``limit`` letters x 2 samples, no eval) with a ``ray:`` section."""
    cfg = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    cfg.pop("eval", None)
    cfg["run"] = f"ray-{uuid.uuid4().hex[:8]}"
    cfg["dataset"] = {"path": str(REPO / "examples" / "data" / "letters.jsonl"), "limit": limit}
    cfg["n_samples_per_prompt"] = 2
    cfg["worker"] = {**cfg["worker"], "concurrency": 2, "lease_s": 8, "poll_s": 0.3}
    cfg["ray"] = {
        "workers_per_node": 1,
        "worker": {"num_cpus": 0.05, "resources": {"sandbox_host": 1}},
        "proxy": {"num_cpus": 0.05},
        "engine": {"num_cpus": 0.05, "resources": {"engine_host": 1}},
        "max_restarts": 3,
    }
    cfg.update(overrides)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_driver(config: Path, address: str, db_url: str, home: Path, *extra: str) -> subprocess.Popen[str]:
    """``dressage-worker rollout --ray ADDRESS --config CONFIG`` as a child process."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRESSAGE_HOME": str(home)}
    env.pop("DRESSAGE_DATABASE_URL", None)
    argv = [sys.executable, "-c", "from dressage.cli import main; main()", "rollout", "--ray", address]
    argv += ["--config", str(config), "--database-url", db_url, *extra]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
