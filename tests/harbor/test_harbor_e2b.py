"""Harbor tasks on sandbox provider ``e2b``: the fixture datasets through ``dressage-worker rollout``
against the local fake of E2B's wire protocol in VM mode (its own root filesystem per sandbox).

The oracle must give the same rewards as on bubblewrap (``EXPECTED`` of the bwrap suite); a task
image needs an E2B template from ``sandbox.e2b.templates`` and is refused, naming the task, without
one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dressage.agents.base import Task
from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.harbor.sandbox import e2b_template, task_spec
from dressage.paddock import SandboxSpec
from dressage.rollout.datasets import load_tasks
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.harbor.conftest import DATASETS
from tests.harbor.test_harbor_rollout import EXPECTED
from tests.paddock.fake_e2b import FakeE2B
from tests.rollout.conftest import open_store, requires_bwrap, write_config

pytestmark = [requires_bwrap, pytest.mark.anyio]  # the fake's VM mode runs commands under bubblewrap


@pytest.fixture
def fake_vm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeE2B]:
    """The fake E2B, reached the way a deployment configures the SDK (environment variables)."""
    with FakeE2B(vm=True) as fake:
        monkeypatch.setenv("E2B_API_KEY", "e2b_fake")
        monkeypatch.setenv("E2B_API_URL", fake.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", fake.url)
        yield fake


async def _rollout(tmp_path: Path, engine_url: str, dataset: Path, sandbox: dict[str, Any]) -> tuple:
    cfg = write_config(
        tmp_path,
        engine_url,
        dataset={"path": str(dataset)},
        n_samples_per_prompt=1,
        agent={"kind": "oracle"},
        reward={"kind": "harbor"},
        sandbox={"provider": "e2b", **sandbox},
        worker={"max_attempts": 1},
    )
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    settings = Settings(database_url=db_url, home=tmp_path / "home")
    report = await run_rollout(
        settings, WorkerOptions(config_path=str(cfg), show_progress=False), Console(stderr=True, quiet=True)
    )
    store = open_store(db_url, tmp_path / "home")
    return store, store.runs.get(report.run)


async def test_fixture_dataset_gives_the_bwrap_rewards_on_e2b(tmp_path, engine_url, fake_vm) -> None:
    store, run = await _rollout(tmp_path, engine_url, DATASETS / "basic", {"template": "harbor-base"})
    names = [t.id for t in load_tasks(DATASETS / "basic", provider="e2b")]
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    sessions = {names[s.info["task_index"]]: (s, rewards.get(s.id)) for s in store.sessions.list(run)}
    assert set(sessions) == {*EXPECTED, "missing-reward"}
    for name, want in EXPECTED.items():
        s, reward = sessions[name]
        assert s.status == "finished" and s.reward == want, (name, s.status, s.error)
        assert s.sandbox == "e2b" and reward["details"]["task"] == name
    multi = sessions["multi-key"][1]["details"]
    assert multi["rewards"] == {"reward": 0.75, "correct": 1.0, "style": 0.5}
    assert sessions["separate-verifier"][1]["details"]["verifier_mode"] == "separate"
    assert sessions["pass"][1]["details"]["internet"] == "refused"
    missing, reward = sessions["missing-reward"]
    assert missing.status == "failed" and reward is None and "no reward file" in (missing.error or "")
    # One VM per session plus the separate verifier's fresh one, all from the image-less default
    # template, none with internet (the run config does not allow network).
    created = fake_vm.state.created
    assert len(created) == 7
    assert {c.get("templateID") for c in created} == {"harbor-base"}
    assert {c.get("allow_internet_access") for c in created} == {False}
    # The task paths were laid out as the VM's root (one setup command per VM), the rest ran as
    # E2B's default user.
    assert fake_vm.state.users.count("root") == 7 and set(fake_vm.state.users) == {"root", "default"}
    store.close()


async def test_a_task_image_without_a_template_is_refused_naming_the_task(
    tmp_path, engine_url, fake_vm
) -> None:
    with pytest.raises(
        ConfigError, match=r"task pip-dockerfile: its environment/Dockerfile needs an E2B template"
    ):
        await _rollout(tmp_path, engine_url, DATASETS / "refused", {})
    with pytest.raises(ConfigError, match=r"task apt-only: its environment/Dockerfile needs an E2B template"):
        await _rollout(tmp_path, engine_url, DATASETS / "apt", {"e2b": {"templates": {"other-task": "t"}}})
    assert fake_vm.state.created == []  # refused before any sandbox (or run) was created


async def test_a_mapped_task_image_runs_on_its_template(tmp_path, engine_url, fake_vm) -> None:
    """A Dockerfile bubblewrap refuses (``FROM python``, ``pip``) runs on E2B from its template."""
    templates = {"pip-dockerfile": "tmpl-pip"}
    store, run = await _rollout(tmp_path, engine_url, DATASETS / "refused", {"e2b": {"templates": templates}})
    (session,) = store.sessions.list(run)
    assert session.status == "finished" and session.reward == 1.0, session.error
    assert [c.get("templateID") for c in fake_vm.state.created] == ["tmpl-pip"]
    store.close()


def test_template_choice_by_task_name_or_image_and_task_paths() -> None:
    info: dict[str, Any] = {"name": "t1", "image": {"kind": "docker_image", "ref": "ghcr.io/x/y:1"}}
    assert e2b_template(info, {"ghcr.io/x/y:1": "by-image"}, "base") == "by-image"
    assert e2b_template(info, {"t1": "by-name", "ghcr.io/x/y:1": "by-image"}, "base") == "by-name"
    with pytest.raises(ConfigError, match=r"task t1: its docker_image 'ghcr.io/x/y:1' needs an E2B template"):
        e2b_template(info, {}, "base")
    assert e2b_template({"name": "t2", "image": None}, {}, "base") == "base"
    # A docker_image task loads on e2b (bubblewrap refuses it); its working directory becomes the VM's workspace.
    (task,) = load_tasks(DATASETS / "apt", provider="e2b")
    assert task.metadata["harbor"]["rootfs"] is None and task.files == {}  # the template holds the COPYs
    assert task.metadata["harbor"]["workdir"] == "/app"  # the Dockerfile's WORKDIR and ENV are read
    assert task.metadata["harbor"]["env"] == {"TASK_GREETING": "bonjour"}
    spec = task_spec(SandboxSpec(provider="e2b"), task, templates={"apt-only": "tmpl-apt"})
    assert spec.template == "tmpl-apt" and spec.rootfs is None
    assert spec.mounts == {
        "/tests": ".harbor/tests",
        "/logs": ".harbor/logs",
        "/solution": ".harbor/solution",
        "/app": ".",
    }
    assert not spec.network  # the run's sandbox.network is off: the task's internet wish is refused
    wants = next(t for t in load_tasks(DATASETS / "basic", provider="e2b") if t.id == "pass")
    assert task_spec(SandboxSpec(provider="e2b", network=True), wants).network  # granted when allowed
    plain = Task(index=0, prompt="x")
    assert task_spec(SandboxSpec(provider="e2b"), plain) == SandboxSpec(provider="e2b")
