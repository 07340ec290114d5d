"""``harbor run --env/--agent`` ours: Harbor (Python 3.12 environment) over our sandbox and agent.

A real ``dressage-worker proxy`` (on the shared dev engine, SQLite log) serves the model calls of
:class:`dressage.harbor.agent.Agent`; Harbor's verifier reads the rewards; ``dressage.harbor.record``
turns the job into a run with one session per trial (``dressage.harbor.job`` does it live, through
Harbor's public ``Job`` hooks). Skipped only when the optional Harbor
environment (``scripts/setup-harbor.sh``) is absent.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dressage.config import Settings
from dressage.store import EventStore
from tests.harbor.conftest import DATASETS, HARBOR_PYTHON, REPO
from tests.harbor.test_harbor_rollout import EXPECTED, _rootfs_missing
from tests.rollout.conftest import requires_bwrap

pytestmark = [
    requires_bwrap,
    pytest.mark.skipif(
        not HARBOR_PYTHON.exists(), reason="the Harbor environment is absent: run scripts/setup-harbor.sh"
    ),
]

TOKEN = "harbor-test-admin-token"


def _env(db_url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRESSAGE_", "VIRTUAL_ENV"))}
    return {
        **env,
        "PYTHONPATH": str(REPO),
        "DRESSAGE_DATABASE_URL": db_url,
        "DRESSAGE_HOME": str(home),
        "DRESSAGE_ADMIN_TOKEN": TOKEN,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: no cost-map download attempts
    }


@pytest.fixture
def proxy(tmp_path: Path, engine_url: str) -> Iterator[tuple[str, str, Path]]:
    """A ``dressage-worker proxy`` on a free port: (its URL, the log's URL, the home)."""
    home = tmp_path / "home"
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    import sys

    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from dressage.cli import main; main()",
            "proxy",
            "--engine-url",
            engine_url,
            "--port",
            "0",
        ],
        env=_env(db_url, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert p.stdout is not None
    url = None
    for line in p.stdout:
        m = re.match(r"proxy: (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    assert url, "the proxy did not start"
    yield url, db_url, home
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(timeout=20)


def _harbor_run(
    path: Path, jobs: Path, db_url: str, home: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(HARBOR_PYTHON.parent / "harbor"),
            "run",
            "--path",
            str(path),
            "--env",
            "dressage.harbor.environment:Environment",
            "-o",
            str(jobs),
            "-n",
            "2",
            "-y",
            *args,
        ],
        env=_env(db_url, home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
    )


def _dataset(tmp_path: Path) -> Path:
    """The basic tasks and the refused one, plus the apt-only one when its root filesystem is built."""
    ds = tmp_path / "dataset"
    ds.mkdir()
    tasks = [*sorted((DATASETS / "basic").iterdir()), DATASETS / "refused" / "pip-dockerfile"]
    if _rootfs_missing() is None:
        tasks.append(DATASETS / "apt" / "apt-only")
    for t in tasks:
        (ds / t.name).symlink_to(t)
    return ds


def _job_with_hooks(dataset: Path, jobs: Path, db_url: str, home: Path) -> None:
    """The oracle through ``python -m dressage.harbor.job`` (Harbor's Job API, trials recorded live)."""
    config = {
        "jobs_dir": str(jobs),
        "n_concurrent_trials": 2,
        "environment": {"import_path": "dressage.harbor.environment:Environment"},
        "agents": [{"name": "oracle"}],
        "datasets": [{"path": str(dataset)}],
    }
    path = jobs.parent / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    r = subprocess.run(
        [str(HARBOR_PYTHON), "-m", "dressage.harbor.job", str(path)],
        env=_env(db_url, home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "recorded" in r.stdout and "failed trials" in r.stdout


@pytest.mark.parametrize("agent", ["oracle", "scripted"])
def test_harbor_run_with_our_environment_and_agent(tmp_path, proxy, agent) -> None:
    """The oracle through Harbor's Job API with our hook; our agent through ``harbor run`` + record."""
    url, db_url, home = proxy
    jobs = tmp_path / "jobs"
    if agent == "oracle":
        _job_with_hooks(_dataset(tmp_path), jobs, db_url, home)
        (job,) = list(jobs.iterdir())
    else:
        agent_args = [
            "--agent",
            "dressage.harbor.agent:Agent",
            "--ak",
            f"proxy_url={url}",
            "--ak",
            "agent=tests.harbor.agents_for_tests:ScriptedHarborAgent",
        ]
        r = _harbor_run(_dataset(tmp_path), jobs, db_url, home, *agent_args)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (job,) = list(jobs.iterdir())
        rec = subprocess.run(
            [str(HARBOR_PYTHON), "-m", "dressage.harbor.record", str(job)],
            env=_env(db_url, home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rec.returncode == 0, rec.stderr
    store = EventStore.open(settings=Settings(database_url=db_url, home=home))
    run = store.runs.get(f"harbor-{job.name}")
    sessions = {s.info["task"]: s for s in store.sessions.list(run)}
    expected = {**EXPECTED, **({"apt-only": 1.0} if "apt-only" in os.listdir(tmp_path / "dataset") else {})}
    assert set(sessions) == {*expected, "missing-reward", "pip-dockerfile"}
    for name, want in expected.items():
        assert sessions[name].status == "finished" and sessions[name].reward == want, name
    assert sessions["missing-reward"].status == "failed"
    assert (sessions["missing-reward"].error or "").startswith("RewardFileNotFoundError")
    # a refused Dockerfile fails its own trial, naming the task and line; the job goes on
    assert sessions["pip-dockerfile"].status == "failed"
    assert "task pip-dockerfile: Dockerfile line 1" in (sessions["pip-dockerfile"].error or "")
    assert all(s.info["trial_name"].startswith(f"{name}__") for name, s in sessions.items())
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    multi = rewards[sessions["multi-key"].id]["details"]["rewards"]
    assert all(r["details"]["attempt"] == 1 for r in rewards.values())
    assert multi == {"reward": 0.75, "correct": 1, "style": 0.5}
    names = [a.name for a in store.artifacts.list(run)]
    assert names.count("result.json") == len(sessions)
    turns = store.turns.read(run, with_experts=False)
    if agent == "oracle":
        assert turns == [] and {s.agent for s in sessions.values()} == {"harbor:oracle"}
    else:  # every model call went through our proxy into this run
        ran = {s.id for name, s in sessions.items() if name != "pip-dockerfile"}  # refused: no agent ran
        assert {t.session_id for t in turns} == ran
    store.close()


LOADER_CHECK = """
import asyncio, sys, tempfile
from pathlib import Path
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths
from dressage.errors import ConfigError
from dressage.harbor.environment import Environment

for d in [*sorted(Path(sys.argv[1]).glob("*/*")), *sorted(Path(sys.argv[2]).glob("*"))]:
    task = Task(d)  # Harbor's own loader accepts every fixture
    print("accepted", task.name)
refused = Task(Path(sys.argv[1]) / "refused" / "pip-dockerfile")
env = Environment(  # built (Harbor builds every trial's environment up front); refused when started
    environment_dir=refused.paths.environment_dir,
    environment_name=refused.name,
    session_id="refused__x__env",
    trial_paths=TrialPaths(Path(tempfile.mkdtemp())),
    task_env_config=refused.config.environment,
)
try:
    asyncio.run(env.start(force_build=False))
except ConfigError as e:
    print("refused", e)
"""


def test_harbor_loader_accepts_the_fixtures_and_our_environment_refuses_one(tmp_path) -> None:
    r = subprocess.run(
        [
            str(HARBOR_PYTHON),
            "-c",
            LOADER_CHECK,
            str(DATASETS),
            str(REPO / "examples" / "harbor" / "letters"),
        ],
        env=_env(f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    accepted = {ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("accepted ")}
    letters = {d.name for d in (REPO / "examples" / "harbor" / "letters").iterdir()}
    assert len(letters) == 12
    tbench = {d.name for d in (DATASETS / "tbench").iterdir()}
    assert accepted == {*EXPECTED, "missing-reward", "apt-only", "pip-dockerfile", *letters, *tbench}
    # not apt-only, so it would be built as written; its base is neither built here nor in a reachable registry
    assert (
        "refused task pip-dockerfile: Dockerfile line 1: base image 'python:3.12-slim' is not built here"
        in r.stdout
    )
