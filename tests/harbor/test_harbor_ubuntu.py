"""Harbor tasks on ``FROM ubuntu:24.04`` (``tests/harbor/datasets/ubuntu``), made from Ubuntu's archive.

``apt-only`` is on the apt-only whitelist: its root filesystem is bootstrapped by ``mmdebstrap`` from
``archive.ubuntu.com`` (Ubuntu's keyring) and run by bubblewrap, on the ``bwrap`` provider and as the
fast path of the ``image`` provider. ``user`` (``RUN useradd``, ``USER``) is built by the image builder
on an ``ubuntu:24.04`` base made the same way. Neither needs a registry. Both are cached (the root
filesystem by its plan, the base by its tag, the task image by its Dockerfile and context) under
``~/.cache/dressage`` (``DRESSAGE_CACHE_DIR``): built once by ``scripts/setup-harbor.sh`` (or by the first
test here), then reused. Where the archive cannot be reached the run is refused before any agent runs.
Tier slow.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.conftest import REQUIRE_ALL
from tests.harbor.conftest import DATASETS
from tests.rollout.conftest import open_store, requires_bwrap, write_config

pytestmark = [requires_bwrap]  # tier slow: tests/conftest.py MODULE_TIERS

UBUNTU = DATASETS / "ubuntu"


def _tools_missing() -> str | None:
    """Why an Ubuntu base cannot be made or run here (None when it can)."""
    from dressage.harbor.distro import UBUNTU_KEYRING, archive_reachable

    missing = [t for t in ("mmdebstrap", "skopeo", "umoci") if shutil.which(t) is None]
    if shutil.which("buildah") is None and shutil.which("podman") is None:
        missing.append("buildah or podman")
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup-harbor.sh installs them)"
    if not UBUNTU_KEYRING.is_file():
        return f"{UBUNTU_KEYRING} is missing (Debian's ubuntu-keyring; scripts/setup-harbor.sh installs it)"
    if not archive_reachable("ubuntu", "noble"):
        return "archive.ubuntu.com cannot be reached from here"
    return None


@pytest.fixture(scope="module", autouse=True)
def _ubuntu_rootfs() -> None:
    """The apt-only task's Ubuntu root filesystem, built once (a cache hit after setup)."""
    reason = _tools_missing()
    if reason is not None:
        if REQUIRE_ALL:
            pytest.fail(f"DRESSAGE_REQUIRE_ALL=1: {reason}", pytrace=False)
        pytest.skip(reason)
    from dressage.harbor.dockerfile import parse_dockerfile, rootfs_plan
    from dressage.harbor.rootfs import build_rootfs

    env_dir = UBUNTU / "apt-only" / "environment"
    build_rootfs(rootfs_plan(parse_dockerfile("apt-only", (env_dir / "Dockerfile").read_text()), env_dir))


async def _rollout(tmp_path: Path, engine_url: str, agent: dict, dataset: Path, provider: str) -> tuple:
    cfg = write_config(
        tmp_path,
        engine_url,
        dataset={"path": str(dataset)},
        n_samples_per_prompt=1,
        agent=agent,
        reward={"kind": "harbor"},
        sandbox={"provider": provider, "network": False},
        worker={"max_attempts": 1, "concurrency": 2},
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    settings = Settings(database_url=db, home=tmp_path / "home")
    report = await run_rollout(
        settings, WorkerOptions(config_path=str(cfg), show_progress=False), Console(stderr=True, quiet=True)
    )
    store = open_store(db, tmp_path / "home")
    return store, store.runs.get(report.run)


def _by_task(store, run, dataset: Path) -> dict[str, tuple]:
    """``{task directory name: (session, reward event payload or None)}`` (one sample per task)."""
    from dressage.harbor.tasks import task_dirs

    names = [d.name for d in task_dirs(dataset)]
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    return {names[s.info["task_index"]]: (s, rewards.get(s.id)) for s in store.sessions.list(run)}


@pytest.mark.anyio
async def test_an_apt_only_ubuntu_task_runs_in_its_ubuntu_rootfs_on_bubblewrap(tmp_path, engine_url) -> None:
    dataset = UBUNTU / "apt-only"
    store, run = await _rollout(tmp_path, engine_url, {"kind": "oracle"}, dataset, "bwrap")
    ((session, reward),) = _by_task(store, run, dataset).values()
    # pytest from Ubuntu's python3-pytest (not on the host), /etc/os-release of 24.04, the ENV and COPY
    assert (session.status, session.reward) == ("finished", 1.0), session.error
    assert "2 passed" in reward["details"]["test_stdout_tail"]
    store.close()


@pytest.mark.anyio
@pytest.mark.parametrize(("agent", "want"), [("oracle", 1.0), ("nothing", 0.0)])
async def test_ubuntu_tasks_beyond_apt_are_built_on_ubuntu_and_run_on_the_image_provider(
    tmp_path, engine_url, agent, want
) -> None:
    """On ``image``: ``apt-only`` through the root-filesystem fast path, ``user`` (``USER runner``) built
    on the ``ubuntu:24.04`` base made from Ubuntu's archive; its build log is stored with its session."""
    agent_cfg = (
        {"kind": "oracle"}
        if agent == "oracle"
        else {"kind": "python", "path": "tests.harbor.agents_for_tests:IdleAgent"}
    )
    store, run = await _rollout(tmp_path, engine_url, agent_cfg, UBUNTU, "image")
    sessions = _by_task(store, run, UBUNTU)
    assert sorted(sessions) == ["apt-only", "user"]
    for name, (session, reward) in sessions.items():
        assert (session.status, session.reward) == ("finished", want), (name, session.error)
        assert reward["details"]["source"] == "reward.txt"
    names = Counter(a.name for a in store.artifacts.list(run))
    assert names["build.log"] == 1 and names["agent.log"] == 2
    store.close()


@pytest.fixture
def dead_ubuntu_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh cache (no base made yet) and an Ubuntu mirror that serves nothing (a real HTTP server on
    loopback over an empty folder)."""
    (tmp_path / "empty").mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "empty"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DRESSAGE_HARBOR_UBUNTU_MIRROR", f"http://127.0.0.1:{server.server_port}/ubuntu")
    yield
    server.shutdown()
    server.server_close()


@pytest.mark.anyio
@pytest.mark.usefixtures("dead_ubuntu_archive")
async def test_an_unreachable_ubuntu_archive_refuses_the_run_naming_task_line_and_image(
    tmp_path, engine_url
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^task user: Dockerfile line 1: base image 'ubuntu:24.04' is made from ubuntu's archive .* "
        r"cannot be reached",
    ):
        await _rollout(tmp_path, engine_url, {"kind": "oracle"}, UBUNTU / "user", "image")
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("agent.log"))


@pytest.mark.usefixtures("dead_ubuntu_archive")
def test_an_unreachable_ubuntu_archive_refuses_the_root_filesystem_naming_task_line_and_image() -> None:
    from dressage.harbor.rootfs import main

    with pytest.raises(
        ConfigError,
        match=r"^task apt-only: Dockerfile line 1: base image 'ubuntu:24.04' is made from ubuntu's",
    ):
        main([str(UBUNTU / "apt-only")])
