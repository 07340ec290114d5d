"""``dressage-worker rollout --ray`` on a 3-node Ray test cluster, on PostgreSQL (conftest.py).

The quickstart (made small) spreads its workers over the nodes, and ends with exactly one finished
session per (task, sample); the same when a worker actor is killed with ``ray.kill`` and when a
node is removed mid-run (its sessions taken over by the other nodes' workers, in-flight resume
included). The node that ran each session is in its ``info``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dressage.cluster.ray_rollout import NAMESPACE
from dressage.store import schema as t
from tests.cluster.conftest import (
    NODE,
    REPO,
    RayTestCluster,
    open_store,
    quickstart_config,
    ray,
    start_driver,
)
from tests.rollout.conftest import requires_bwrap

pytestmark = [pytest.mark.slow, pytest.mark.postgres, requires_bwrap, pytest.mark.timeout(600)]


def sessions_of(url: str, home: Path, run: str) -> list[Any]:
    """Every session of ``run`` with its task's (task, sample) pair."""
    store = open_store(url, home)
    try:
        r = store.runs.get(run)
        q = (
            select(t.sessions, t.tasks.c.task_index, t.tasks.c.sample_index)
            .join(t.tasks, t.tasks.c.id == t.sessions.c.task_id)
            .where(t.sessions.c.run_id == r.id)
        )
        with store.db.engine.connect() as conn:
            return list(conn.execute(q).all())
    finally:
        store.close()


def events_of(url: str, home: Path, run: str, kind: str) -> int:
    """How many ``kind`` events ``run`` has."""
    store = open_store(url, home)
    try:
        r = store.runs.get(run)
        with store.db.engine.connect() as conn:
            rows = conn.execute(
                select(t.events.c.position).where(t.events.c.run_id == r.id, t.events.c.kind == kind)
            ).all()
        return len(rows)
    finally:
        store.close()


def assert_exactly_once(rows: list[Any], pairs: int) -> None:
    """One finished session per (task, sample), all pairs done."""
    finished = Counter((r.task_index, r.sample_index) for r in rows if r.status == "finished")
    assert len(finished) == pairs, finished
    assert set(finished.values()) == {1}, finished


def wait_for(predicate: Any, what: str, timeout_s: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = predicate()
        if out:
            return out
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: Any) -> str:
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:]
    return str(out)


def test_quickstart_spreads_over_the_nodes_once_per_pair(
    ray_cluster: RayTestCluster, cluster_pg_url: str, tmp_path: Path
) -> None:
    config = quickstart_config(tmp_path)
    run = config.read_text().split("run: ")[1].split()[0]
    out = finish(start_driver(config, ray_cluster.address, cluster_pg_url, tmp_path / "home"))
    rows = sessions_of(cluster_pg_url, tmp_path / "home", run)
    assert_exactly_once(rows, 12)
    nodes = {r.info["ray_node_id"] for r in rows if r.status == "finished"}
    assert nodes == {ray_cluster.node_id(n) for n in ("head", "node-2", "node-3")}, nodes
    assert all(r.info["worker"].startswith("ray-127.0.0.1-") for r in rows)
    assert "Ray workers (3 on 3 nodes)" in out and "sessions finished" in out
    assert f"run {run} done" in " ".join(out.split())


def running_on(url: str, home: Path, run: str, node_id: str | None = None) -> list[Any]:
    """Running sessions of ``run`` with at least one recorded turn (on ``node_id``, if given)."""
    store = open_store(url, home)
    try:
        r = store.runs.get(run)
        q = (
            select(t.sessions.c.id, t.sessions.c.info)
            .where(t.sessions.c.run_id == r.id, t.sessions.c.status == "running")
            .where(select(t.turns.c.id).where(t.turns.c.session_id == t.sessions.c.id).exists())
        )
        with store.db.engine.connect() as conn:
            rows = conn.execute(q).all()
    except Exception:  # the run is not created yet
        return []
    finally:
        store.close()
    return [r for r in rows if node_id is None or r.info.get("ray_node_id") == node_id]


def restarts_of(actor: Any) -> tuple[int, str]:
    """``(restarts, state)`` of ``actor`` in Ray's control store (GCS): how often Ray restarted it."""
    info = ray._private.state.actors(actor_id=actor._actor_id.hex())
    return int(info["NumRestarts"]), str(info["State"])


def wait_until_restarted(actor: Any, driver: subprocess.Popen[str], timeout: float = 180.0) -> None:
    """Wait until Ray has restarted ``actor``, just killed with ``ray.kill(no_restart=False)``.

    The restarted instance is awaited until it is alive, or until the run's driver has ended: on a
    loaded machine the other workers can take the killed sessions over and drain the queue before
    the new instance has started, and the driver then stops every actor. Either way Ray's control
    store must count the restart; an actor that stays dead fails here when the time is up.
    """
    deadline = time.monotonic() + timeout
    while True:
        restarts, state = restarts_of(actor)
        if restarts >= 1 and (state == "ALIVE" or driver.poll() is not None):
            return
        assert time.monotonic() < deadline, (
            f"the killed actor was not restarted: {restarts} restarts, {state}"
        )
        time.sleep(0.5)


def slow_config(tmp: Path) -> Path:
    """The small quickstart with an agent that pauses after its model call, so sessions are in flight."""
    return quickstart_config(
        tmp, agent={"kind": "python", "path": "tests.rollout.agents_for_tests:slow_answer"}
    )


def start_slow_run(tmp: Path, cluster: RayTestCluster, url: str) -> tuple[str, Path, subprocess.Popen[str]]:
    """The driver of :func:`slow_config`'s run on ``cluster``: ``(run name, home, driver process)``."""
    config = slow_config(tmp)
    run = config.read_text().split("run: ")[1].split()[0]
    home = tmp / "home"
    return run, home, start_driver(config, cluster.address, url, home)


def test_a_killed_worker_actor_is_restarted_and_each_pair_finishes_once(
    ray_cluster: RayTestCluster, cluster_pg_url: str, tmp_path: Path
) -> None:
    run, home, proc = start_slow_run(tmp_path, ray_cluster, cluster_pg_url)
    busy = wait_for(lambda: running_on(cluster_pg_url, home, run), "a session in flight")
    victim = busy[0].info["worker"]
    index = int(victim.split("-")[-2])
    actor = ray.get_actor(f"dressage-worker:{run}:{index}", namespace=NAMESPACE)
    ray.kill(actor, no_restart=False)
    wait_until_restarted(actor, proc)
    finish(proc)
    rows = sessions_of(cluster_pg_url, home, run)
    assert_exactly_once(rows, 12)
    killed = {s.id for s in busy if s.info["worker"] == victim}
    assert all(r.status == "finished" and r.info["worker"] != victim for r in rows if r.id in killed)
    assert events_of(cluster_pg_url, home, run, "session_resumed") >= 1


def test_a_removed_node_s_sessions_are_taken_over(
    ray_cluster: RayTestCluster, cluster_pg_url: str, tmp_path: Path
) -> None:
    gone = ray_cluster.node_id("node-3")
    run, home, proc = start_slow_run(tmp_path, ray_cluster, cluster_pg_url)
    in_flight = wait_for(lambda: running_on(cluster_pg_url, home, run, gone), "a session in flight on node-3")
    ray_cluster.cluster.remove_node(ray_cluster.nodes.pop("node-3"))
    try:
        finish(proc)
    finally:  # the next test gets three nodes again
        ray_cluster.nodes["node-3"] = ray_cluster.cluster.add_node(**NODE, resources={"sandbox_host": 1})
    rows = sessions_of(cluster_pg_url, home, run)
    assert_exactly_once(rows, 12)
    taken = {r.id: r for r in rows if r.id in {s.id for s in in_flight}}
    assert taken and all(r.status == "finished" and r.info["ray_node_id"] != gone for r in taken.values())
    assert events_of(cluster_pg_url, home, run, "session_resumed") >= 1


def test_one_loop_iteration_with_its_rollout_on_ray(
    ray_cluster: RayTestCluster, cluster_pg_url: str, tmp_path: Path
) -> None:
    config = quickstart_config(tmp_path, limit=4)
    run = f"loop-{config.read_text().split('run: ')[1].split()[0]}"
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRESSAGE_HOME": str(home)}
    env.pop("DRESSAGE_DATABASE_URL", None)
    argv = [
        sys.executable,
        "-c",
        "from dressage.cli import main; main()",
        "loop",
        "--ray",
        ray_cluster.address,
    ]
    argv += [
        "--config",
        str(config),
        "-k",
        "1",
        "--run",
        run,
        "--database-url",
        cluster_pg_url,
        "--no-progress",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = sessions_of(cluster_pg_url, home, run)
    assert_exactly_once(rows, 8)
    assert all(r.info.get("ray_node_id") for r in rows), [r.info for r in rows]
    store = open_store(cluster_pg_url, home)
    try:
        assert store.versions.latest(store.runs.get(run)) == 1  # the iteration trained and pushed
    finally:
        store.close()
