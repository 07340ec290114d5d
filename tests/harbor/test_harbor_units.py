"""The pieces of the Harbor source without a sandbox: reward files, reward selection, Dockerfiles, tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dressage.errors import ConfigError, RewardError
from dressage.harbor.dockerfile import parse_dockerfile
from dressage.harbor.sandbox import harbor_mounts, task_spec
from dressage.harbor.tasks import load_harbor_tasks, task_checksum
from dressage.harbor.verifier import parse_reward_json, parse_reward_text, select_reward
from dressage.paddock import SandboxSpec
from dressage.rollout.config import parse_config
from tests.harbor.conftest import DATASETS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("  \n", "empty"),
        ("yes", "not a number"),
        ("nan", "non-finite"),
        ("inf\n", "non-finite"),
    ],
)
def test_bad_reward_txt_is_an_error_never_zero(text: str, message: str) -> None:
    with pytest.raises(RewardError, match=message):
        parse_reward_text(text)


def test_reward_txt_and_json_read_as_harbor_reads_them() -> None:
    assert parse_reward_text("0.25\n") == {"reward": 0.25}
    assert parse_reward_json('{"a": 1, "b": 0.5}') == {"a": 1.0, "b": 0.5}
    assert parse_reward_json("3") == {"reward": 3.0}
    for bad, message in [
        ("", "empty"),
        ("{", "not valid JSON"),
        ('{"a": "1"}', "non-numeric"),
        ('{"a": NaN}', "non-finite"),
        ('{"a": 1e999}', "non-finite"),
        ("[1]", "object"),
        ('{"a": true}', "non-numeric"),
    ]:
        with pytest.raises(RewardError, match=message):
            parse_reward_json(bad)


def test_reward_selection_by_key_weights_or_default() -> None:
    rewards = {"correct": 1.0, "style": 0.5}
    assert select_reward(rewards, "style", None) == 0.5
    assert select_reward(rewards, None, {"correct": 0.8, "style": 0.4}) == pytest.approx(1.0)
    assert select_reward({"only": 0.3}, None, None) == 0.3
    assert select_reward({**rewards, "reward": 0.7}, None, None) == 0.7
    with pytest.raises(RewardError, match=r"set reward\.key or reward\.weights"):
        select_reward(rewards, None, None)
    with pytest.raises(RewardError, match="'speed' is not among"):
        select_reward(rewards, "speed", None)
    with pytest.raises(RewardError, match=r"name \['speed'\]"):
        select_reward(rewards, None, {"speed": 1.0})


def test_whitelisted_dockerfile_becomes_a_plan() -> None:
    plan = parse_dockerfile(
        "t",
        "# comment\nFROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y \\\n  git python3=3.11.2-1\n"
        "WORKDIR /srv\nENV A=1 B=two\nENV C three\nCOPY a.txt b/ ./\n",
    )
    assert plan.suite == "bookworm" and plan.packages == ["git", "python3"]
    assert plan.workdir == "/srv" and plan.env == {"A": "1", "B": "two", "C": "three"}
    assert plan.copies == [("a.txt", "/srv/./"), ("b/", "/srv/./")]


@pytest.mark.parametrize(
    ("image", "suite"),
    [
        ("debian", "trixie"),
        ("debian:latest", "trixie"),
        ("debian:stable", "trixie"),
        ("debian:13", "trixie"),
        ("debian:trixie-slim", "trixie"),
        ("debian:12", "bookworm"),
        ("debian:bullseye", "bullseye"),
    ],
)
def test_a_debian_tag_becomes_the_release_it_is(image: str, suite: str) -> None:
    plan = parse_dockerfile("t", f"FROM {image}\n")
    assert plan.suite == suite and plan.base == (image if ":" in image else f"{image}:latest")


@pytest.mark.parametrize(
    ("image", "suite"),
    [
        ("ubuntu:20.04", "focal"),
        ("ubuntu:focal", "focal"),
        ("ubuntu:22.04", "jammy"),
        ("ubuntu:jammy", "jammy"),
        ("ubuntu:24.04", "noble"),
        ("ubuntu:noble", "noble"),
        ("ubuntu:26.04", "resolute"),
        ("ubuntu", "resolute"),  # Docker Hub's latest: the newest LTS
        ("ubuntu:latest", "resolute"),
        ("ubuntu:rolling", "stonking"),  # the newest release, LTS or not
    ],
)
def test_an_ubuntu_tag_becomes_the_release_it_is(image: str, suite: str) -> None:
    plan = parse_dockerfile(
        "t", f"# an Ubuntu task\nFROM {image}\nRUN apt-get update && apt-get install -y git\n"
    )
    assert (plan.suite, plan.distro, plan.base_line) == (suite, "ubuntu", 2)
    assert plan.base == (image if ":" in image else f"{image}:latest") and plan.packages == ["git"]
    assert "base_line" not in plan.to_json()  # the line is not part of the plan (nor of its cache key)


def test_an_ubuntu_base_is_bootstrapped_from_ubuntus_archive_with_its_keyring() -> None:
    from dressage.harbor.distro import UBUNTU_KEYRING, mmdebstrap_args

    if not UBUNTU_KEYRING.is_file():
        with pytest.raises(ConfigError, match="ubuntu-keyring package"):
            mmdebstrap_args("ubuntu", "noble")
        return
    args = mmdebstrap_args("ubuntu", "noble")
    assert args[:2] == [f"--keyring={UBUNTU_KEYRING}", "--components=main,restricted,universe,multiverse"]
    assert args[2:4] == ["noble", "{target}"]
    assert args[4:] == [
        f"deb http://archive.ubuntu.com/ubuntu noble{pocket} main restricted universe multiverse"
        for pocket in ("", "-updates", "-security")
    ]
    assert mmdebstrap_args("debian", "trixie") == ["trixie", "{target}", "http://deb.debian.org/debian"]


def test_an_unreachable_archive_refuses_the_task_naming_line_and_image(tmp_path: Path, monkeypatch) -> None:
    """An archive that does not serve the release (a real HTTP server on loopback with nothing in it):
    the base is refused naming the task, the FROM line and the image, before anything is built."""
    import functools
    import http.server
    import threading

    from dressage.harbor.distro import require_archive

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("DRESSAGE_HARBOR_UBUNTU_MIRROR", f"http://127.0.0.1:{server.server_port}/ubuntu")
        with pytest.raises(ConfigError) as e:
            require_archive("task t: Dockerfile line 3", "ubuntu:24.04", "ubuntu", "noble")
    finally:
        server.shutdown()
        server.server_close()
    assert str(e.value).startswith(
        "task t: Dockerfile line 3: base image 'ubuntu:24.04' is made from ubuntu's"
    )
    assert "cannot be reached" in str(e.value)


@pytest.mark.parametrize(
    ("dockerfile", "line", "what"),
    [
        ("FROM python:3.12\n", 1, "base image 'python:3.12' is refused"),
        (
            "# base\nFROM ubuntu:18.04\n",
            2,
            "base image 'ubuntu:18.04' is refused: ubuntu tag '18.04' is not made",
        ),
        ("FROM ubuntu:noble-20240530\n", 1, "ubuntu tag 'noble-20240530' is not made here; use one of focal"),
        ("FROM ubuntu:devel\n", 1, "ubuntu tag 'devel' is not made here"),
        ("FROM debian:sid\n", 1, "base image 'debian:sid' is refused"),
        ("FROM debian:bookworm\n\nRUN pip install numpy\n", 3, "RUN 'pip install numpy' is refused"),
        (
            "FROM debian:bookworm\nRUN apt-get install -y curl && curl -sL x | sh\n",
            2,
            "RUN 'curl -sL x | sh'",
        ),
        ("FROM debian:bookworm\nUSER agent\n", 2, "USER is refused"),
        ("FROM debian:bookworm\nADD https://x/y /y\n", 2, "ADD is refused"),
        ("FROM debian:bookworm AS b\n", 1, "refused"),
        ("FROM debian:bookworm\nCOPY --from=b /x /x\n", 2, "only 'COPY SRC... DST'"),
        ("FROM debian:bookworm\nFROM debian:bookworm\n", 2, "multi-stage"),
    ],
)
def test_other_dockerfiles_are_refused_naming_task_and_line(dockerfile: str, line: int, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_dockerfile("my-task", dockerfile)
    assert str(e.value).startswith(f"task my-task: Dockerfile line {line}: ") and what in str(e.value)


def test_tasks_are_read_with_tests_hidden_and_solution_apart() -> None:
    tasks = load_harbor_tasks(DATASETS / "basic")
    assert [t.id for t in tasks] == sorted(t.id for t in tasks)
    t = next(t for t in tasks if t.id == "pass")
    assert t.prompt is not None and t.prompt.startswith("Write the word hello")
    assert set(t.tests) == {"test.sh"} and t.files == {}
    info = t.metadata["harbor"]
    assert set(info["solution"]) == {"solve.sh"} and info["workdir"] == "/app"
    assert info["config"]["verifier"]["timeout_sec"] == 60.0 and info["wants_internet"] is True
    assert (
        load_harbor_tasks(DATASETS / "basic" / "pass")[0].metadata["harbor"]["checksum"] == info["checksum"]
    )


def test_checksum_follows_every_file(tmp_path: Path) -> None:
    task = tmp_path / "pass"
    shutil.copytree(DATASETS / "basic" / "pass", task)
    before = task_checksum(task)
    (task / "tests" / "test.sh").write_text((task / "tests" / "test.sh").read_text() + "\n")
    assert task_checksum(task) != before


def test_what_the_reader_cannot_honour_is_refused(tmp_path: Path) -> None:
    task = tmp_path / "t"
    shutil.copytree(DATASETS / "basic" / "pass", task)
    toml = (task / "task.toml").read_text()
    for extra, what in [
        ("gpus = 1\n", "environment.gpus"),
        ('docker_image = "org/img:1"\n', "prebuilt image 'org/img:1'"),
        ('os = "windows"\n', "environment.os"),
    ]:
        (task / "task.toml").write_text(toml + extra)
        with pytest.raises(ConfigError, match=f"task t: .*{what}"):
            load_harbor_tasks(task)
    (task / "task.toml").write_text(toml)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(ConfigError, match=r"tests/test\.sh is missing"):
        load_harbor_tasks(task)


def test_internet_is_refused_unless_the_run_allows_network() -> None:
    t = load_harbor_tasks(DATASETS / "basic" / "pass")[0]
    assert task_spec(SandboxSpec(network=False), t).network is False
    assert task_spec(SandboxSpec(network=True), t).network is True
    info = {**t.metadata["harbor"], "wants_internet": False}
    offline = type(t)(index=0, prompt="x", metadata={"harbor": info}, kind="harbor")
    assert task_spec(SandboxSpec(network=True), offline).network is False
    letters = load_harbor_tasks(DATASETS.parents[2] / "examples" / "harbor" / "letters")
    assert all(t.metadata["harbor"]["wants_internet"] is False for t in letters)  # no-network
    assert harbor_mounts("/app")["/app"] == "." and "/workspace" not in harbor_mounts("/workspace")


def test_harbor_reward_config_is_checked() -> None:
    base = {"run": "r", "dataset": {"path": str(DATASETS / "basic")}}
    cfg = parse_config({**base, "reward": {"kind": "harbor", "weights": {"correct": 1}}})
    assert cfg.reward.kind == "harbor"
    with pytest.raises(ConfigError, match="weights must name"):
        parse_config({**base, "reward": {"kind": "harbor", "weights": {}}})
    assert parse_config({**base, "agent": {"kind": "oracle"}}).agent.kind == "oracle"


def test_a_harbor_dataset_needs_its_reward_and_the_oracle_needs_harbor_tasks(tmp_path: Path) -> None:
    from dressage.rollout.datasets import check_reward_fits, load_tasks

    tasks = load_tasks(DATASETS / "basic")
    check_reward_fits(tasks, "harbor", "oracle")
    with pytest.raises(ConfigError, match="use reward kind 'harbor'"):
        check_reward_fits(tasks, "contains", "answer")
    with pytest.raises(ConfigError, match="run in sandbox provider 'bwrap', 'image' or 'e2b', not 'local'"):
        check_reward_fits(tasks, "harbor", "answer", "local")
    (tmp_path / "t.jsonl").write_text('{"prompt": "hi", "label": "x"}\n')
    with pytest.raises(ConfigError, match="agent kind 'oracle'"):
        check_reward_fits(load_tasks(tmp_path / "t.jsonl"), "contains", "oracle")
    # provider image: a Harbor dataset's tasks bring their own images; JSONL rows need sandbox.image
    check_reward_fits(tasks, "harbor", "answer", "image")
    with pytest.raises(ConfigError, match=r"sandbox\.image: provider image needs an image reference"):
        check_reward_fits(load_tasks(tmp_path / "t.jsonl"), "contains", "answer", "image")
    check_reward_fits(load_tasks(tmp_path / "t.jsonl"), "contains", "answer", "image", None, "oci:/x:latest")


@pytest.mark.anyio
async def test_providers_without_mount_namespaces_refuse_harbor_mounts() -> None:
    from dressage.errors import NotSupportedError
    from dressage.paddock.local import LocalProvider

    with pytest.raises(NotSupportedError, match="need provider 'bwrap'"):
        await LocalProvider().create("s", SandboxSpec(provider="local", mounts={"/tests": ".harbor/tests"}))


def test_one_reward_config_serves_reward_txt_and_multi_key_tasks() -> None:
    """Issue 26, point 12: with ``reward.key`` set, a ``reward.txt`` task used to fail (no such key);
    without it, the multi-key task failed and its rewards were lost. Each task now takes the first rule
    that applies to it, and says which."""
    from dressage.harbor.verifier import choose_reward

    multi = {"correct": 1.0, "style": 0.5}
    assert choose_reward(multi, "correct", None) == (1.0, "key 'correct'")
    assert choose_reward({"reward": 0.25}, "correct", None) == (0.25, "the only value")
    assert choose_reward({"reward": 0.25}, None, {"correct": 1.0}) == (0.25, "the only value")
    assert choose_reward({**multi, "reward": 0.7}, "speed", None) == (0.7, "key 'reward'")
    assert choose_reward(multi, None, {"correct": 0.5, "style": 1.0}) == (1.0, "weights")
    with pytest.raises(RewardError) as failed:
        choose_reward(multi, None, None)
    assert '{"correct": 1.0, "style": 0.5}' in str(failed.value)  # every value stays in the log


def test_an_image_less_tasks_environment_files_are_placed_in_its_workdir(tmp_path: Path) -> None:
    task_dir = tmp_path / "pass"
    shutil.copytree(DATASETS / "basic" / "pass", task_dir)
    (task_dir / "environment" / "data.csv").write_text("a,b\n1,2\n")
    (task_dir / "environment" / "lib").mkdir()
    (task_dir / "environment" / "lib" / "helper.py").write_text("X = 1\n")
    (task,) = load_harbor_tasks(task_dir)
    assert task.files["data.csv"] == "a,b\n1,2\n" and task.files["lib/helper.py"] == "X = 1\n"


def test_a_harbor_trial_with_several_rewards_and_no_key_is_recorded_finished_with_a_null_reward(
    store, run_name: str, tmp_path: Path
) -> None:
    """Issue 35: ``dressage.harbor.record`` keeps such a trial (it used to record it failed, its
    rewards only in the error): finished, every reward in the ``reward`` event, a NULL reward saying why."""
    from dressage.harbor.record import job_run, record_trial

    run = job_run(store, run_name)
    result = {"trial_name": "t1", "task_name": "named", "verifier_result": {"rewards": {"a": 1, "b": 0.5}}}
    assert record_trial(store, run, tmp_path, result, 1) is True
    (session,) = store.sessions.list(run)
    assert (session.status, session.reward) == ("finished", None)
    assert "several rewards" in session.info["no_scalar_reward"] and session.info["trial_name"] == "t1"
    (event,) = store.events.read(run, kinds=("reward",))
    assert event.payload["reward"] is None and event.payload["details"]["rewards"] == {"a": 1, "b": 0.5}
    result2 = {"trial_name": "t2", "task_name": "named", "verifier_result": {"rewards": {"a": 1, "b": 0.5}}}
    assert record_trial(store, run, tmp_path, result2, 1, key="a") is True
    assert {s.info["trial_name"]: s.reward for s in store.sessions.list(run)} == {"t1": None, "t2": 1.0}


def _compose(tmp_path: Path, text: str) -> dict:
    from dressage.harbor.compose import compose_environment

    env_dir = tmp_path / "environment"
    env_dir.mkdir(exist_ok=True)
    (env_dir / "docker-compose.yaml").write_text(text)
    return compose_environment("t", env_dir, "build")


def test_a_compose_file_runs_as_far_as_one_service_goes(tmp_path: Path) -> None:
    """Issue 35: terminal-bench's usual one-service compose file (build context, keep-alive command,
    environment, working_dir) becomes the task's Dockerfile, env and workdir; a prebuilt image its
    docker_image."""
    got = _compose(
        tmp_path,
        "services:\n  client:\n    build:\n      context: .\n      dockerfile: Dockerfile.task\n"
        "    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}\n    container_name: x\n"
        "    command: [sh, -c, sleep infinity]\n    environment:\n      - TEST_DIR=/tests\n"
        "    working_dir: /srv\n",
    )
    assert got == {"dockerfile": "Dockerfile.task", "env": {"TEST_DIR": "/tests"}, "workdir": "/srv"}
    got = _compose(tmp_path, "services:\n  main:\n    image: org/img:1\n    environment: {A: 1}\n")
    assert got == {"docker_image": "org/img:1", "env": {"A": "1"}}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("services:\n  a: {image: x}\n  b: {image: y}\n", "services (2 services: a, b)"),
        ("services:\n  a:\n    image: x\n    volumes: [./d:/d]\n", "services.a.volumes"),
        ("services:\n  a:\n    build: {context: ..}\n", "services.a.build.context '..' (not environment/)"),
        ("services:\n  a:\n    build: {context: ., args: {X: 1}}\n", "services.a.build.args"),
        ("services:\n  a: {image: x}\nnetworks: {n: {}}\n", "networks"),
    ],
)
def test_a_compose_file_beyond_one_service_is_refused_naming_the_field(
    tmp_path: Path, text: str, field: str
) -> None:
    with pytest.raises(ConfigError) as e:
        _compose(tmp_path, text)
    assert str(e.value).startswith(f"task t: environment/docker-compose.yaml: {field} is refused")


def test_a_dockerfile_beyond_apt_on_bubblewrap_names_the_image_provider(tmp_path: Path) -> None:
    """Not apt-only on plain bubblewrap: the refusal names the line and says how it runs (provider image)."""
    task = tmp_path / "t"
    shutil.copytree(DATASETS / "basic" / "pass", task)
    (task / "environment" / "Dockerfile").write_text("FROM debian:trixie\nUSER nobody\n")
    with pytest.raises(ConfigError, match=r"Dockerfile line 2: USER is refused.*sandbox.provider: image"):
        load_harbor_tasks(task)


def test_the_build_key_follows_the_dockerfile_the_context_and_local_bases(tmp_path: Path) -> None:
    from dressage.harbor.build import build_key

    (tmp_path / "a.txt").write_text("a")
    key = build_key("FROM x\n", tmp_path)
    assert build_key("FROM x\n", tmp_path) == key
    assert build_key("FROM y\n", tmp_path) != key
    assert build_key("FROM x\n", tmp_path, ("sha256:1",)) != key
    (tmp_path / "a.txt").write_text("b")
    assert build_key("FROM x\n", tmp_path) != key


def test_a_named_image_builder_that_is_not_there_is_refused_saying_what_was_tried(
    tmp_path: Path, monkeypatch
) -> None:
    from pydantic import ValidationError

    from dressage.config import load_settings
    from dressage.harbor.builder import find_builder

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no builder on PATH
    for kind in ("docker", "podman", "buildah"):
        monkeypatch.setenv("DRESSAGE_HARBOR_BUILDER", kind)
        with pytest.raises(ConfigError, match=rf"harbor_builder: {kind}; {kind}: not installed"):
            find_builder()
    monkeypatch.setenv("DRESSAGE_HARBOR_BUILDER", "auto")
    with pytest.raises(
        ConfigError, match="docker: not installed; podman: not installed; buildah: not installed"
    ):
        find_builder()
    monkeypatch.setenv("DRESSAGE_HARBOR_BUILDER", "kaniko")
    with pytest.raises(ValidationError, match="harbor_builder"):
        load_settings()
