"""``rollout --ray local`` on a 2-CPU machine: a one-node Ray cluster with 2 CPUs (as ``ray.init()``
starts on a 2-core laptop), joined through ``RAY_ADDRESS``, with the quickstart's config as a new
user runs it (no ``ray:`` section, SQLite).

The defaults fit: the dev engine and its proxy take half a CPU each, the worker the CPU left, and
the quickstart runs. A worker that asks for more than the engine and proxy leave (1.5 CPUs: the
node's total would cover it) is refused in one line, before any actor is created, instead of
waiting for room forever (issue 34: 9 minutes of silence).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import NODE, REPO, open_store, ray
from tests.rollout.conftest import requires_bwrap

pytestmark = [pytest.mark.slow, requires_bwrap, pytest.mark.timeout(900)]

HANG_GUARD_S = 600
"""Only so a hang (the bug) fails the test instead of blocking it; not a timing assertion."""


@pytest.fixture(scope="module")
def two_cpu_cluster() -> Iterator[str]:
    """One Ray node with 2 CPUs; yields its address."""
    if ray is None:
        pytest.skip("Ray is not installed (pip install 'dressage[ray]')")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE, "num_cpus": 2, "include_dashboard": False}
    )
    cluster.wait_for_nodes()
    try:
        yield str(cluster.address)
    finally:
        cluster.shutdown()


def quickstart(tmp: Path, **overrides: Any) -> Path:
    """examples/quickstart.yaml as is (a run name of its own, absolute dataset paths), plus ``overrides``."""
    cfg = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    cfg["run"] = f"small-{uuid.uuid4().hex[:8]}"
    cfg["dataset"]["path"] = str(REPO / "examples" / "data" / "letters.jsonl")
    cfg["eval"]["dataset"]["path"] = str(REPO / "examples" / "data" / "letters_eval.jsonl")
    cfg.update(overrides)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def ray_local(address: str, config: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``dressage-worker rollout --ray local --config CONFIG`` joining the cluster at ``address``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRESSAGE_HOME": str(home), "RAY_ADDRESS": address}
    env["COLUMNS"] = "200"
    env.pop("DRESSAGE_DATABASE_URL", None)
    argv = [sys.executable, "-c", "from dressage.cli import main; main()", "rollout", "--ray", "local"]
    argv += ["--config", str(config), "--no-progress", "--database-url", f"sqlite:///{home / 'log.db'}"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_the_quickstart_fits_two_cpus(two_cpu_cluster: str, tmp_path: Path) -> None:
    config = quickstart(tmp_path)
    done = ray_local(two_cpu_cluster, config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = yaml.safe_load(config.read_text())["run"]
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}", tmp_path)
    try:
        # 12 tasks x 4 samples and the eval round: 6 held-out tasks x 2
        assert store.runs.summary(run).sessions == {"finished": 60}
    finally:
        store.close()


def test_a_worker_that_does_not_fit_what_is_left_is_refused_in_one_line(
    two_cpu_cluster: str, tmp_path: Path
) -> None:
    config = quickstart(tmp_path, ray={"worker": {"num_cpus": 1.5}})
    done = ray_local(two_cpu_cluster, config, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith(
        "error: ray: no node has what 1 worker(s) need (CPU=1.5) free after this run's dev engine (CPU=0.5) "
        "and proxy (CPU=0.5) actors on 127.0.0.1; nodes (free of total): 127.0.0.1 ("
    )
    assert "CPU=1 of 2" in line  # what the engine and proxy would leave of the node
    assert "starting the dev engine" not in done.stderr  # refused before any actor was created
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}", tmp_path)
    try:
        assert store.runs.list() == []  # nor was the run created
    finally:
        store.close()
