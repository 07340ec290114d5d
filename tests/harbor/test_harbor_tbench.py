"""Terminal-Bench-style tasks (``tests/harbor/datasets/tbench``) end to end on the ``image`` provider.

Four tasks whose Dockerfiles bubblewrap's apt-only whitelist refuses: one installs with pip (from
PyPI, at build time), one runs as a ``USER``, one is a multi-stage build with ``COPY --from`` and
``ADD``, one names a prebuilt ``docker_image``. Their base (``localhost/dressage-tbench/base:1``, Debian
from Debian's packages with pip) and the prebuilt image are built locally once by
``scripts/setup-harbor.sh`` (no registry image can be pulled here); each task image is built by
buildah once per Dockerfile content. The oracle scores 1 and an agent that does nothing 0 on every
task, through the rollout worker and through ``harbor run`` with our environment; the quickstart's
answer agent goes through one loop iteration on them. A failed build fails its task with the build's
error while the run's other tasks finish; an unknown base refuses the run before any agent runs.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.conftest import REQUIRE_ALL
from tests.harbor.conftest import DATASETS, HARBOR_PYTHON, REPO
from tests.rollout.conftest import open_store, requires_bwrap, write_config

pytestmark = [requires_bwrap]  # tiers external and slow: tests/conftest.py MODULE_TIERS

TBENCH = DATASETS / "tbench"
TASKS = ("multi-stage", "pip-install", "prebuilt-image", "user")
LOCAL_IMAGES = ("localhost/dressage-tbench/base:1", "localhost/dressage-tbench/tool:1")


def _images_missing() -> str | None:
    """Why the tbench images cannot be used here (None when they can)."""
    missing = [t for t in ("buildah", "skopeo", "umoci", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup-harbor.sh installs them)"
    from dressage.harbor.build import image_id

    absent = [name for name in LOCAL_IMAGES if image_id(name) is None]
    if absent:
        return f"the tbench fixture's local images {absent} are not built: run scripts/setup-harbor.sh"
    return None


@pytest.fixture(autouse=True)
def _tbench_images() -> None:
    reason = _images_missing()
    if reason is not None:
        if REQUIRE_ALL:
            pytest.fail(f"DRESSAGE_REQUIRE_ALL=1: {reason}", pytrace=False)
        pytest.skip(reason)


def _by_task(store, run, dataset: Path) -> dict[str, tuple]:
    """``{task directory name: (session, reward event payload or None)}`` (one sample per task)."""
    from dressage.harbor.tasks import task_dirs

    names = [d.name for d in task_dirs(dataset)]
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    return {names[s.info["task_index"]]: (s, rewards.get(s.id)) for s in store.sessions.list(run)}


def _config(tmp_path: Path, engine_url: str, agent: dict, dataset: Path) -> Path:
    return write_config(
        tmp_path,
        engine_url,
        dataset={"path": str(dataset)},
        n_samples_per_prompt=1,
        agent=agent,
        reward={"kind": "harbor"},
        sandbox={"provider": "image", "network": False},
        worker={"max_attempts": 1, "concurrency": 2},
    )


async def _rollout(tmp_path: Path, engine_url: str, agent: dict, dataset: Path = TBENCH) -> tuple:
    cfg = _config(tmp_path, engine_url, agent, dataset)
    db = f"sqlite:///{tmp_path / 'log.db'}"
    settings = Settings(database_url=db, home=tmp_path / "home")
    report = await run_rollout(
        settings, WorkerOptions(config_path=str(cfg), show_progress=False), Console(stderr=True, quiet=True)
    )
    store = open_store(db, tmp_path / "home")
    return store, store.runs.get(report.run)


@pytest.mark.anyio
@pytest.mark.parametrize(("agent", "want"), [("oracle", 1.0), ("nothing", 0.0)])
async def test_the_oracle_scores_1_and_an_idle_agent_0_through_the_rollout_worker(
    tmp_path, engine_url, agent, want
) -> None:
    agent_cfg = (
        {"kind": "oracle"}
        if agent == "oracle"
        else {"kind": "python", "path": "tests.harbor.agents_for_tests:IdleAgent"}
    )
    store, run = await _rollout(tmp_path, engine_url, agent_cfg)
    sessions = _by_task(store, run, TBENCH)
    assert sorted(sessions) == list(TASKS)
    for name, (session, reward) in sessions.items():
        assert (session.status, session.reward) == ("finished", want), (name, session.error)
        assert reward["details"]["source"] == "reward.txt"
    # the three Dockerfile tasks store their image's build log with each session; the prebuilt one none
    names = Counter(a.name for a in store.artifacts.list(run))
    assert names["build.log"] == 3 and names["agent.log"] == 4
    store.close()


@pytest.mark.anyio
async def test_a_failed_build_fails_its_task_with_the_build_error_and_the_run_goes_on(
    tmp_path, engine_url
) -> None:
    dataset = tmp_path / "ds"
    shutil.copytree(TBENCH / "user", dataset / "user")
    shutil.copytree(DATASETS / "basic" / "pass", dataset / "image-less")  # as on bwrap: host /usr
    shutil.copytree(TBENCH / "user", dataset / "broken")
    (dataset / "broken" / "environment" / "Dockerfile").write_text(
        "FROM localhost/dressage-tbench/base:1\nRUN echo building-broken && exit 7\n"
    )
    store, run = await _rollout(tmp_path, engine_url, {"kind": "oracle"}, dataset)
    sessions = _by_task(store, run, dataset)
    assert (sessions["user"][0].status, sessions["user"][0].reward) == ("finished", 1.0)
    assert (sessions["image-less"][0].status, sessions["image-less"][0].reward) == ("finished", 1.0)
    broken = sessions["broken"][0]
    assert broken.status == "failed" and "task broken: building its Dockerfile failed" in (broken.error or "")
    assert "exit status 7" in (broken.error or "") or "exit 7" in (broken.error or ""), broken.error
    logs = [a for a in store.artifacts.list(run) if a.name == "build.log" and a.session_id == broken.id]
    assert len(logs) == 1
    store.close()


@pytest.mark.anyio
async def test_an_unknown_base_refuses_the_run_naming_task_line_and_image(tmp_path, engine_url) -> None:
    dataset = tmp_path / "ds"
    shutil.copytree(TBENCH / "user", dataset / "elsewhere")
    (dataset / "elsewhere" / "environment" / "Dockerfile").write_text(
        "# from a registry\nFROM registry.invalid/org/img:1\nUSER nobody\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"task elsewhere: Dockerfile line 2: base image 'registry.invalid/org/img:1' is not built here",
    ):
        await _rollout(tmp_path, engine_url, {"kind": "oracle"}, dataset)


def test_the_quickstart_agent_and_the_loop_go_through_one_iteration(tmp_path: Path) -> None:
    from tests.conftest import require_module

    require_module("torch", "the loop trains with torch (the 'engine' extra)")
    from dressage.store import EventStore
    from tests.log_builders import tiny_loop_config
    from tests.loop_driver import drive_loop

    cfg = tiny_loop_config("tbench-loop", {"path": str(TBENCH)}, reward="harbor", lr=50.0, iterations=1)
    cfg["sandbox"] = {**cfg["sandbox"], "provider": "image"}  # type: ignore[dict-item]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
    store = EventStore.open(settings=settings)
    loop, _ = drive_loop(store, settings, path, tmp_path / "out", quiet=True)
    try:
        run = store.runs.get(loop.run_name)
        assert sorted(run.config["harbor_tasks"]) == list(TASKS)
        assert [s.finished for s in loop.stats] == [8]
        rewards = [e.payload for e in store.events.read(run, kinds=("reward",))]
        assert len(rewards) == 8 and all(r["details"]["source"] == "reward.txt" for r in rewards)
        assert [e.payload["version"] for e in store.events.read(run, kinds=("policy_version",))] == [0, 1]
        assert len(store.consumers.steps(run, "train:loop")) == 1
    finally:
        store.close()


def _harbor_env(home: Path) -> dict[str, str]:
    """The environment of a ``.venv-harbor`` process: ours without ``DRESSAGE_*`` settings except the
    cache (where the task images are), this repository on the path, its own home, offline litellm."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRESSAGE_", "VIRTUAL_ENV"))}
    if os.environ.get("DRESSAGE_CACHE_DIR"):
        env["DRESSAGE_CACHE_DIR"] = os.environ["DRESSAGE_CACHE_DIR"]
    return {
        **env,
        "PYTHONPATH": str(REPO),
        "DRESSAGE_HOME": str(home),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


HARBOR_LOADER = """
import json, sys
from pathlib import Path
from harbor.models.task.task import Task
from dressage.harbor.tasks import load_harbor_tasks

ours = {t.id: t.metadata["harbor"] for t in load_harbor_tasks(sys.argv[1], images="build")}
for d in sorted(Path(sys.argv[1]).iterdir()):
    task = Task(d)
    mine = ours[task.name]
    print(json.dumps({
        "name": task.name,
        "docker_image": task.config.environment.docker_image,
        "ours_image": (mine["image"] or {}).get("ref"),
        "agent_timeout": task.config.agent.timeout_sec,
        "ours_agent_timeout": mine["agent_timeout_s"],
        "built": bool((mine["build"] or {}).get("ref")),
    }))
"""


@pytest.mark.skipif(
    not HARBOR_PYTHON.exists(), reason="the Harbor environment is absent: run scripts/setup-harbor.sh"
)
def test_harbors_loader_and_ours_agree_on_the_tbench_tasks(tmp_path: Path) -> None:
    import json

    env = _harbor_env(tmp_path / "home")
    r = subprocess.run(
        [str(HARBOR_PYTHON), "-c", HARBOR_LOADER, str(TBENCH)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert sorted(rows) == list(TASKS)
    for row in rows.values():
        assert row["docker_image"] == row["ours_image"] and row["agent_timeout"] == row["ours_agent_timeout"]
        assert row["built"]
    assert rows["prebuilt-image"]["docker_image"] == "localhost/dressage-tbench/tool:1"


@pytest.mark.skipif(
    not HARBOR_PYTHON.exists(), reason="the Harbor environment is absent: run scripts/setup-harbor.sh"
)
@pytest.mark.parametrize(("agent", "want"), [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_run_with_our_environment_scores_the_oracle_1_and_nop_0(tmp_path: Path, agent, want) -> None:
    """``harbor run --env dressage.harbor.environment:Environment`` builds and runs the same images
    (Harbor's own ``oracle`` and ``nop`` agents); ``dressage.harbor.record`` records the job."""

    from dressage.store import EventStore

    db_url, home = f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home"
    env = {**_harbor_env(home), "DRESSAGE_DATABASE_URL": db_url}
    jobs = tmp_path / "jobs"
    r = subprocess.run(
        [
            str(HARBOR_PYTHON.parent / "harbor"), "run", "--path", str(TBENCH),
            "--env", "dressage.harbor.environment:Environment", "--agent", agent,
            "-o", str(jobs), "-n", "2", "-y",
        ],
        env=env, capture_output=True, text=True, timeout=600, cwd=str(REPO),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (job,) = list(jobs.iterdir())
    rec = subprocess.run(
        [str(HARBOR_PYTHON), "-m", "dressage.harbor.record", str(job)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    store = EventStore.open(settings=Settings(database_url=db_url, home=home))
    try:
        sessions = {s.info["task"]: s for s in store.sessions.list(store.runs.get(f"harbor-{job.name}"))}
        assert sorted(sessions) == list(TASKS)
        for name, s in sessions.items():
            assert (s.status, s.reward) == ("finished", want), (name, s.error)
    finally:
        store.close()


def test_concurrent_builds_of_one_dockerfile_build_it_once(tmp_path: Path, monkeypatch) -> None:
    """Workers (here threads) that load the same Dockerfile together get one image: one builds under
    the key's lock, the others wait and take it (without the lock the later ones would fail to move
    their copy into place); a later load is served from the cache without building."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from dressage.harbor.build import build
    from dressage.harbor.builder import find_builder

    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))  # a fresh cache and build storage
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    text = "FROM scratch\nCOPY a.txt /a.txt\n"
    (ctx / "Dockerfile").write_text(text)
    (ctx / "a.txt").write_text(uuid.uuid4().hex)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: build("t", text, ctx), range(3)))
    assert all(r.error is None for r in results), [r.error for r in results]
    assert len({r.ref for r in results}) == 1 and len({r.key for r in results}) == 1
    log = Path(str(results[0].log))
    before = log.stat().st_mtime_ns
    assert log.read_text().count(f"$ {find_builder().kind} build ") == 1
    assert build("t", text, ctx).ref == results[0].ref and log.stat().st_mtime_ns == before
