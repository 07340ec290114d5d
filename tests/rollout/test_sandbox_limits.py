"""A run's sandbox limits hold as configured, or the run refuses to start: real worker processes.

"No cgroup here" is a real condition, not a stand-in: the ``cgroup_root`` setting points at a
folder where no cgroup hierarchy is mounted, exactly what a worker sees on a machine (or in a
container) without one. A config accepting only ``cgroup`` (the default) is refused in one line
before anything starts; one accepting ``[cgroup, rlimit]`` runs, prints the mechanism in force
and records it in the run's snapshot.
"""

from __future__ import annotations

from pathlib import Path

from tests.paddock.conftest import requires_open_checkout
from tests.rollout.conftest import open_store, requires_bwrap, start_worker, write_config, write_tasks

pytestmark = [requires_bwrap]

TASKS = [{"prompt": f"Say something with '{c}'.", "label": c} for c in "ea"]


def _rollout(tmp_path: Path, cfg: Path, cgroup_root: Path) -> tuple[int, list[str]]:
    home = tmp_path / "home"
    worker = start_worker(["--config", str(cfg)], home, DRESSAGE_CGROUP_ROOT=str(cgroup_root))
    out, _ = worker.communicate(timeout=300)
    return worker.returncode, out.decode().splitlines()


def test_a_config_requiring_cgroups_is_refused_where_none_can_be_made(tmp_path: Path) -> None:
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    no_cgroups = tmp_path / "no-cgroups"
    no_cgroups.mkdir()
    # The engine is never reached: the refusal comes before anything starts.
    cfg = write_config(tmp_path, "http://127.0.0.1:9", name="strict")
    code, lines = _rollout(tmp_path, cfg, no_cgroups)
    assert code != 0
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and len(lines) == 1, lines
    assert errors[0] == (
        "error: sandbox limits refused: max_processes 64 and memory_mb 512 need a cgroup, and none can "
        f"be made here (no cgroup v1 pids hierarchy (nor cgroup v2): {no_cgroups}/pids); sandbox.limits "
        "accepts [cgroup]: give the worker a delegated cgroup (or one it may write under the cgroup_root "
        "setting), or accept rlimits explicitly with sandbox.limits: [cgroup, rlimit] "
        '(docs/rollout.md "Limits")'
    )
    store = open_store(f"sqlite:///{tmp_path / 'home' / 'dressage.db'}", tmp_path / "home")
    try:
        assert [r.name for r in store.runs.list()] == []  # nothing was created
    finally:
        store.close()


@requires_open_checkout
def test_a_config_accepting_rlimits_runs_with_them_and_records_it(tmp_path: Path, engine_url: str) -> None:
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    no_cgroups = tmp_path / "no-cgroups"
    no_cgroups.mkdir()
    cfg = write_config(
        tmp_path, engine_url, name="weaker", n_samples_per_prompt=1, sandbox={"limits": ["cgroup", "rlimit"]}
    )
    code, lines = _rollout(tmp_path, cfg, no_cgroups)
    assert code == 0, lines
    said = [line for line in lines if line.startswith("sandbox limits:")]
    assert len(said) == 1 and said[0].startswith("sandbox limits: rlimit (RLIMIT_NPROC 68 "), lines
    assert f"no cgroup: no cgroup v1 pids hierarchy (nor cgroup v2): {no_cgroups}/pids" in said[0]
    store = open_store(f"sqlite:///{tmp_path / 'home' / 'dressage.db'}", tmp_path / "home")
    try:
        run = store.runs.get("weaker")
        assert run.config["sandbox_limits"] == "rlimit"
        assert run.config["rollout"]["sandbox"]["limits"] == ["cgroup", "rlimit"]
        assert {s.status for s in store.sessions.list(run)} == {"finished"}
    finally:
        store.close()
