"""Harbor fixture datasets through ``dressage-worker rollout``: real proxy, dev engine, bubblewrap, both databases.

The oracle (``solution/solve.sh``) and a scripted whitebox agent that calls the model through the
proxy run the same tasks; each task's own ``tests/test.sh`` gives the reward, read from
``reward.txt`` / ``reward.json`` as Harbor reads it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from dressage.config import Settings
from dressage.errors import ConfigError, SandboxError
from dressage.rollout.datasets import load_tasks
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.harbor.conftest import DATASETS
from tests.rollout.conftest import open_store, requires_bwrap, write_config

pytestmark = [requires_bwrap, pytest.mark.anyio]

EXPECTED = {"pass": 1.0, "fail": 0.0, "multi-key": 0.75, "hidden-tests": 1.0, "separate-verifier": 1.0}


async def _rollout(tmp_path: Path, db_url: str, engine_url: str, agent: dict, dataset: Path) -> tuple:
    cfg = write_config(
        tmp_path,
        engine_url,
        dataset={"path": str(dataset)},
        n_samples_per_prompt=1,
        agent=agent,
        reward={"kind": "harbor"},
        worker={"max_attempts": 1},
    )
    settings = Settings(database_url=db_url, home=tmp_path / "home")
    report = await run_rollout(
        settings, WorkerOptions(config_path=str(cfg), show_progress=False), Console(stderr=True, quiet=True)
    )
    store = open_store(db_url, tmp_path / "home")
    return store, store.runs.get(report.run)


def _by_task(store, run, dataset: Path) -> dict[str, tuple]:
    """``{task name: (session, reward event payload or None)}`` (one sample per task)."""
    names = [t.id for t in load_tasks(dataset)]
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    return {names[s.info["task_index"]]: (s, rewards.get(s.id)) for s in store.sessions.list(run)}


@pytest.mark.parametrize("agent", ["oracle", "scripted"])
async def test_fixture_dataset_gives_expected_rewards(tmp_path, any_db_url, engine_url, agent) -> None:
    agent_cfg = (
        {"kind": "oracle"}
        if agent == "oracle"
        else {"kind": "python", "path": "tests.harbor.agents_for_tests:ScriptedHarborAgent"}
    )
    store, run = await _rollout(tmp_path, any_db_url, engine_url, agent_cfg, DATASETS / "basic")
    sessions = _by_task(store, run, DATASETS / "basic")
    assert set(sessions) == {*EXPECTED, "missing-reward"}
    for name, want in EXPECTED.items():
        s, reward = sessions[name]
        assert s.status == "finished" and s.reward == want, (name, s.status, s.error)
        assert reward["details"]["task"] == name and reward["details"]["kind"] == "harbor"
    multi = sessions["multi-key"][1]["details"]
    assert (
        multi["rewards"] == {"reward": 0.75, "correct": 1.0, "style": 0.5}
        and multi["source"] == "reward.json"
    )
    assert sessions["separate-verifier"][1]["details"]["verifier_mode"] == "separate"
    assert sessions["pass"][1]["details"]["internet"] == "refused"
    missing, reward = sessions["missing-reward"]
    assert missing.status == "failed" and reward is None
    assert "no reward file" in (missing.error or "")
    # Each task's checksum and parsed task.toml are recorded with the run.
    recorded = run.config["harbor_tasks"]
    assert sorted(recorded) == sorted(sessions) and all(len(v["checksum"]) == 64 for v in recorded.values())
    assert recorded["separate-verifier"]["config"]["verifier"]["environment_mode"] == "separate"
    names = Counter(a.name for a in store.artifacts.list(run))
    assert names["agent.log"] == 6 and names["workspace.tar.gz"] == 6
    turns = store.turns.read(run, with_experts=False)
    if agent == "oracle":
        assert turns == []
    else:
        assert {t.session_id for t in turns} == {s.id for s, _ in sessions.values()}
    store.close()


def _rootfs_missing() -> str | None:
    from dressage.harbor.rootfs import cached_rootfs
    from dressage.harbor.tasks import harbor_info

    plan = harbor_info(load_tasks(DATASETS / "apt")[0])["rootfs"]  # type: ignore[index]
    try:
        cached_rootfs(plan)
    except SandboxError as e:
        return f"the apt-only task's Debian rootfs is not built (scripts/setup-harbor.sh builds it): {e}"
    return None


@pytest.mark.skipif(_rootfs_missing() is not None, reason=str(_rootfs_missing()))
@pytest.mark.parametrize("agent", ["oracle", "scripted"])
async def test_apt_only_dockerfile_runs_in_its_debian_rootfs(tmp_path, engine_url, agent) -> None:
    agent_cfg = (
        {"kind": "oracle"}
        if agent == "oracle"
        else {"kind": "python", "path": "tests.harbor.agents_for_tests:ScriptedHarborAgent"}
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    store, run = await _rollout(tmp_path, db, engine_url, agent_cfg, DATASETS / "apt")
    ((session, reward),) = _by_task(store, run, DATASETS / "apt").values()
    # pytest from the rootfs (Debian's python3-pytest, not on the host), the COPY and ENV of the Dockerfile.
    assert session.status == "finished" and session.reward == 1.0, session.error
    assert "2 passed" in reward["details"]["test_stdout_tail"]
    store.close()


async def test_refused_dockerfile_stops_the_run_before_it_starts(tmp_path, engine_url) -> None:
    with pytest.raises(
        ConfigError, match=r"task pip-dockerfile: Dockerfile line 1: base image 'python:3.12-slim' is refused"
    ):
        await _rollout(
            tmp_path, f"sqlite:///{tmp_path / 'log.db'}", engine_url, {"kind": "oracle"}, DATASETS / "refused"
        )


async def test_a_blackbox_cli_runs_harbor_tasks_through_the_proxy(tmp_path, engine_url) -> None:
    script = (Path(__file__).with_name("blackbox_agent.py")).read_text()
    agent = {"kind": "command", "command": ["/usr/bin/python3", "-I", "-S", "-c", script]}
    db = f"sqlite:///{tmp_path / 'log.db'}"
    store, run = await _rollout(tmp_path, db, engine_url, agent, DATASETS / "basic")
    sessions = _by_task(store, run, DATASETS / "basic")
    for name, want in EXPECTED.items():
        s, _reward = sessions[name]
        assert s.status == "finished" and s.reward == want, (name, s.status, s.error)
    turns = store.turns.read(run, with_experts=False)
    assert {t.session_id for t in turns} == {s.id for s, _ in sessions.values()}
    store.close()


@pytest.mark.parametrize("any_db_url", ["sqlite"], indirect=True)
async def test_one_reward_key_serves_a_mixed_dataset_and_environment_files_are_placed(
    tmp_path, any_db_url, engine_url
) -> None:
    """Issue 26, point 12: ``reward.key: correct`` trains the multi-key task on its ``correct`` and the
    ``reward.txt`` tasks on their only value (each says which rule chose it); an image-less task finds
    its ``environment/`` files in its working directory."""
    import shutil

    dataset = tmp_path / "mixed"
    for name in ("pass", "multi-key"):
        shutil.copytree(DATASETS / "basic" / name, dataset / name)
    shutil.copytree(DATASETS / "basic" / "pass", dataset / "env-files")
    (dataset / "env-files" / "environment" / "seed.txt").write_text("from environment/\n")
    (dataset / "env-files" / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/seed.txt)" = "from environment/" ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    cfg = write_config(
        tmp_path,
        engine_url,
        dataset={"path": str(dataset)},
        n_samples_per_prompt=1,
        agent={"kind": "oracle"},
        reward={"kind": "harbor", "key": "correct"},
        worker={"max_attempts": 1},
    )
    settings = Settings(database_url=any_db_url, home=tmp_path / "home")
    report = await run_rollout(
        settings, WorkerOptions(config_path=str(cfg), show_progress=False), Console(stderr=True, quiet=True)
    )
    store = open_store(any_db_url, tmp_path / "home")
    sessions = _by_task(store, store.runs.get(report.run), dataset)
    got = {
        name: (s.status, s.reward, (r or {}).get("details", {}).get("chosen_by"))
        for name, (s, r) in sessions.items()
    }
    assert got == {
        "pass": ("finished", 1.0, "the only value"),
        "multi-key": ("finished", 1.0, "key 'correct'"),
        "env-files": ("finished", 1.0, "the only value"),
    }
    assert sessions["multi-key"][1]["details"]["rewards"] == {"reward": 0.75, "correct": 1.0, "style": 0.5}
    store.close()


@pytest.mark.parametrize("any_db_url", ["sqlite"], indirect=True)
async def test_several_rewards_and_no_rule_finish_with_a_null_reward_that_training_refuses(
    tmp_path, any_db_url, engine_url
) -> None:
    """Issue 35: a task writing several rewards, none called ``reward``, in a run with no
    ``reward.key``/``reward.weights`` used to fail (its rewards lost). Its session now finishes with
    every reward kept and a NULL scalar reward saying why; training refuses it with that message
    instead of dropping the group or reading it as 0."""
    import shutil

    from dressage.errors import TrainingError
    from dressage.training import StepOptions
    from dressage.training.groups import START_CURSOR, GroupTracker
    from dressage.training.steps import StepBuilder

    dataset = tmp_path / "named"
    shutil.copytree(DATASETS / "basic" / "multi-key", dataset / "named-only")
    (dataset / "named-only" / "tests" / "test.sh").write_text(
        '#!/bin/bash\necho \'{"correct": 1, "style": 0.5}\' > /logs/verifier/reward.json\n'
    )
    store, run = await _rollout(tmp_path, any_db_url, engine_url, {"kind": "oracle"}, dataset)
    ((session, reward),) = _by_task(store, run, dataset).values()
    assert (session.status, session.reward) == ("finished", None)
    assert "set reward.key or reward.weights" in session.info["no_scalar_reward"]
    assert reward["reward"] is None and reward["details"]["rewards"] == {"correct": 1.0, "style": 0.5}
    assert reward["details"]["chosen_by"] is None

    pending = GroupTracker(store, run, 1).poll()
    builder = StepBuilder(store, run, StepOptions(global_batch_size=1, n_samples_per_prompt=1))
    with pytest.raises(TrainingError, match=r"finished without a scalar reward: the task wrote several") as e:
        builder.form(1, pending, START_CURSOR)
    assert session.id in str(e.value) and "nothing was consumed" in str(e.value)
    assert len(GroupTracker(store, run, 1).poll()) == 1  # the group is still there to train later
    store.close()
