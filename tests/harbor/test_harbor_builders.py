"""One Harbor task built by each image builder (``harbor_builder``: buildah, Podman, Docker) scores the same.

The task is ``tests/harbor/datasets/ubuntu/user`` (``FROM ubuntu:24.04``, ``RUN useradd``, ``USER``), copied
with a label unique to the test so that the builder under test builds it now (task images are cached by
Dockerfile and context, whichever builder made them). Each build runs through the rollout worker on the
``image`` provider: the oracle scores 1, the build log (``$ <builder> build ...``) is stored with the
session, and the images' configs (user, working directory, environment, command) agree.

Docker: its own daemon where one answers; otherwise the ``docker`` builder runs against Podman's
Docker-compatible API service (``podman system service`` on a socket of the test, ``DOCKER_HOST``), with
the ``docker`` client if installed, else ``podman`` under that name (its CLI takes Docker's arguments),
so the Docker code path (build, inspect, ``skopeo copy docker-daemon:``) runs wherever Podman does.
Tiers external and slow; without Podman (or Docker) the tests skip with the reason
(``DRESSAGE_REQUIRE_ALL=1``: they fail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_ALL
from tests.harbor.conftest import DATASETS
from tests.harbor.test_harbor_ubuntu import _by_task, _rollout, _tools_missing
from tests.rollout.conftest import requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.anyio]  # tiers external and slow: tests/conftest.py MODULE_TIERS

TASK = DATASETS / "ubuntu" / "user"


def _skip(reason: str) -> None:
    if REQUIRE_ALL:
        pytest.fail(f"DRESSAGE_REQUIRE_ALL=1: {reason}", pytrace=False)
    pytest.skip(reason)


def _builder_missing(kind: str) -> str | None:
    """Why ``kind`` cannot build here (None when it can)."""
    from dressage.harbor.builder import Builder

    exe = shutil.which(kind)
    if exe is None:
        return f"{kind} is not installed (scripts/setup-images.sh, scripts/setup_container_engine.sh)"
    if kind == "podman":
        r = subprocess.run(
            Builder(kind, exe).argv("images", "-q"), capture_output=True, text=True, timeout=60
        )
        if r.returncode != 0:
            return f"podman does not work here: {r.stderr.strip()[-300:]}"
    return None


async def _build_and_run(tmp_path: Path, engine_url: str, kind: str, monkeypatch) -> dict:
    """Build the task's fresh copy with ``kind`` and run the oracle on it; what came out."""
    from dressage.harbor.tasks import load_harbor_tasks

    reason = _tools_missing() or _builder_missing(kind)
    if reason is not None:
        _skip(reason)
    monkeypatch.setenv("DRESSAGE_HARBOR_BUILDER", kind)
    dataset = tmp_path / f"ds-{kind}"
    shutil.copytree(TASK, dataset / "user")
    dockerfile = dataset / "user" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"LABEL dressage.test.build={kind}-{uuid.uuid4().hex}\n")
    (tmp_path / kind).mkdir()
    store, run = await _rollout(tmp_path / kind, engine_url, {"kind": "oracle"}, dataset, "image")
    ((session, reward),) = _by_task(store, run, dataset).values()
    (log,) = [store.artifacts.get(a) for a in store.artifacts.list(run) if a.name == "build.log"]
    store.close()
    (task,) = load_harbor_tasks(dataset, images="build")  # the image now in the cache: no build
    ref = task.metadata["harbor"]["build"]["ref"]
    raw = subprocess.run(["skopeo", "inspect", "--config", ref], capture_output=True, text=True, check=True)
    config = json.loads(raw.stdout)["config"]
    return {"session": session, "reward": reward, "log": log.decode(), "config": config, "ref": ref}


def _same_image(a: dict, b: dict) -> None:
    for key in ("User", "WorkingDir", "Env", "Cmd"):
        assert a.get(key) == b.get(key), key


async def test_podman_builds_the_task_buildah_builds_and_it_scores_the_same(
    tmp_path, engine_url, monkeypatch
) -> None:
    runs = {
        kind: await _build_and_run(tmp_path, engine_url, kind, monkeypatch) for kind in ("buildah", "podman")
    }
    for kind, out in runs.items():
        assert (out["session"].status, out["session"].reward) == ("finished", 1.0), (
            kind,
            out["session"].error,
        )
        assert f"\n$ {kind} build " in out["log"], out["log"][-2000:]
    assert runs["podman"]["config"]["User"] == "runner"
    _same_image(runs["buildah"]["config"], runs["podman"]["config"])


@pytest.fixture
def docker_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Docker API: the daemon of the ``docker`` client where it answers, else Podman's API service on
    a socket of this test (with ``podman`` as the ``docker`` client where Docker's is not installed)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "images", "-q"], capture_output=True, timeout=60).returncode == 0:
        yield "docker daemon"
        return
    podman = shutil.which("podman")
    if podman is None:
        _skip("no Docker daemon answers and Podman is not installed (scripts/setup_container_engine.sh)")
    socket = tmp_path / "podman.sock"
    service = subprocess.Popen(
        [str(podman), "system", "service", "--time=0", f"unix://{socket}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if docker is None:
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "docker").symlink_to(str(podman))
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    try:
        deadline = time.monotonic() + 60
        while not socket.exists():  # the service creates its socket when it listens
            assert service.poll() is None and time.monotonic() < deadline, (
                "podman system service did not start"
            )
            time.sleep(0.1)
        yield "podman system service"
    finally:
        service.terminate()
        service.wait(timeout=30)


async def test_docker_builds_the_task_through_a_docker_api_and_it_scores_the_same(
    tmp_path, engine_url, monkeypatch, docker_api
) -> None:
    out = await _build_and_run(tmp_path, engine_url, "docker", monkeypatch)
    assert (out["session"].status, out["session"].reward) == ("finished", 1.0), (
        docker_api,
        out["session"].error,
    )
    assert "\n$ docker build " in out["log"] and " docker-daemon:localhost/dressage-harbor/" in out["log"]
    assert out["config"]["User"] == "runner" and out["config"]["WorkingDir"] == "/home/runner/work"


async def test_an_image_in_the_docker_daemon_runs_as_an_image_sandbox(
    tmp_path, engine_url, monkeypatch, docker_api
) -> None:
    """``sandbox.image: docker-daemon:NAME:TAG``: the task image Docker built, read from its daemon."""
    from dressage.paddock import SandboxSpec
    from dressage.paddock.image import ImageProvider
    from dressage.paddock.image_store import ImageStore

    out = await _build_and_run(tmp_path, engine_url, "docker", monkeypatch)
    # The build exported its image and removed it from the daemon: load it back under a name of ours.
    name = f"localhost/dressage-test/{uuid.uuid4().hex}:latest"
    daemon = ["--dest-daemon-host", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
    subprocess.run(["skopeo", "copy", "--quiet", *daemon, out["ref"], f"docker-daemon:{name}"], check=True)
    store = ImageStore(root=tmp_path / "images")
    spec = SandboxSpec(provider="image", image=f"docker-daemon:{name}")
    async with await ImageProvider(store=store).create("from-docker", spec) as sb:
        r = await sb.exec("id -un; pwd")
    assert r.stdout.split() == ["runner", "/home/runner/work"], (docker_api, r)
    assert store.unpacks == 1
