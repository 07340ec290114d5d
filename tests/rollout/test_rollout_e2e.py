"""The rollout worker end to end: real proxy, real dev engine, real bubblewrap, real SQLite/PostgreSQL.

Failures (an agent that crashes or hangs, a sandbox that cannot start, a missing agent binary)
become recorded failed attempts, retried up to max_attempts, and the rest of the run finishes.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.rollout.conftest import REPO, open_store, requires_bwrap, worker_env, write_config, write_tasks

pytestmark = [requires_bwrap, pytest.mark.anyio]

LETTERS = [{"prompt": f"Say something with '{c}'.", "label": c} for c in "eatos"]


async def _run(tmp_path: Path, db_url: str, cfg_path: Path, **opts) -> object:
    settings = Settings(database_url=db_url, home=tmp_path / "home")
    options = WorkerOptions(config_path=str(cfg_path), show_progress=False, **opts)
    return await run_rollout(settings, options, Console(stderr=True, quiet=True))


async def test_answer_agent_run_records_turns_rewards_and_artifacts(tmp_path, any_db_url, engine_url) -> None:
    write_tasks(tmp_path / "tasks.jsonl", LETTERS)
    cfg = write_config(tmp_path, engine_url)
    report = await _run(tmp_path, any_db_url, cfg)
    store = open_store(any_db_url, tmp_path / "home")
    run = store.runs.get(report.run)
    sessions = store.sessions.list(run)
    assert len(sessions) == 10 and {s.status for s in sessions} == {"finished"}
    assert store.tasks.counts(run)["done"] == 10
    rewards = {e.session_id: e.payload for e in store.events.read(run, kinds=("reward",))}
    assert set(rewards) == {s.id for s in sessions}
    assert all(
        rewards[s.id]["reward"] == s.reward and rewards[s.id]["details"]["kind"] == "contains"
        for s in sessions
    )
    turns = store.turns.read(run, with_experts=False)
    assert {t.session_id for t in turns} == {s.id for s in sessions}
    assert all(len(t.generated_ids) <= 8 and t.loss_mask.all() for t in turns)
    names = Counter(a.name for a in store.artifacts.list(run))
    assert names == {"agent.log": 10, "workspace.tar.gz": 10}
    assert run.config["rollout"]["agent"]["kind"] == "answer" and "dataset_sha256" in run.config
    assert run.config["sandbox_limits"] == "cgroup"  # the default accepts nothing weaker
    # Running the same config again continues the run and does nothing twice.
    again = await _run(tmp_path, any_db_url, cfg)
    assert again.outcomes == {} and len(store.sessions.list(run)) == 10
    store.close()


async def test_failures_are_recorded_attempts_and_the_run_goes_on(tmp_path, engine_url) -> None:
    db = f"sqlite:///{tmp_path / 'log.db'}"
    rows = [
        {"prompt": "fine", "label": "e"},
        {"prompt": "will crash", "label": "crash"},
        {"prompt": "will hang", "label": "hang"},
    ]
    write_tasks(tmp_path / "tasks.jsonl", rows)
    cfg = write_config(
        tmp_path,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "python", "path": "tests.rollout.agents_for_tests:CrashingAgent"},
        worker={"session_timeout_s": 1.5, "max_attempts": 2},
    )
    report = await _run(tmp_path, db, cfg)
    store = open_store(db, tmp_path / "home")
    run = store.runs.get(report.run)
    by_task: dict[int, list] = {}
    for s in store.sessions.list(run):
        by_task.setdefault(s.info["task_index"], []).append(s)
    assert [s.status for s in by_task[0]] == ["finished"]
    assert [(s.status, s.finish_reason) for s in by_task[1]] == [("failed", "agent_crashed")] * 2
    assert "RuntimeError: boom: the agent has a bug" in by_task[1][0].error
    assert [(s.status, s.finish_reason) for s in by_task[2]] == [("failed", "agent_timeout")] * 2
    assert store.tasks.counts(run) == {"pending": 0, "leased": 0, "done": 1, "failed": 2}
    log = next(a for a in store.artifacts.list(run, session_id=by_task[1][0].id) if a.name == "agent.log")
    assert b"Traceback" in store.artifacts.get(log)
    store.close()


async def test_sandbox_that_fails_to_start_and_missing_binary(tmp_path, engine_url, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path / 'log.db'}"
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
    cfg = write_config(tmp_path, engine_url, n_samples_per_prompt=1, worker={"max_attempts": 2})
    monkeypatch.setenv("DRESSAGE_BWRAP", str(tmp_path / "no-bwrap-here"))
    report = await _run(tmp_path, db, cfg)
    monkeypatch.delenv("DRESSAGE_BWRAP")
    store = open_store(db, tmp_path / "home")
    sessions = store.sessions.list(report.run)
    assert len(sessions) == 4 and {s.finish_reason for s in sessions} == {"sandbox_failed"}
    assert "sandbox bwrap failed to start: cannot run bubblewrap" in sessions[0].error
    assert store.tasks.counts(report.run)["failed"] == 2

    (tmp_path / "b").mkdir()
    write_tasks(tmp_path / "b" / "tasks.jsonl", LETTERS[:1])
    cfg = write_config(
        tmp_path / "b",
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "command", "command": ["no-such-agent"]},
    )
    report = await _run(tmp_path, db, cfg)
    sessions = store.sessions.list(report.run)
    assert {s.finish_reason for s in sessions} == {"agent_error"}
    assert "agent binary 'no-such-agent' not found in the sandbox" in sessions[0].error
    store.close()


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="curl and jq are needed")
async def test_blackbox_curl_through_the_proxy_without_network(tmp_path, engine_url) -> None:
    """The example's curl+jq agent, run by the generic command adapter inside bwrap (network off),
    reaches the real proxy through the Unix-socket forwarder; its turns are recorded token-exactly."""
    import yaml

    example = yaml.safe_load((REPO / "examples" / "blackbox.yaml").read_text())
    db = f"sqlite:///{tmp_path / 'log.db'}"
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
    cfg = write_config(tmp_path, engine_url, agent=example["agent"], sandbox={"network": False})
    report = await _run(tmp_path, db, cfg)
    store = open_store(db, tmp_path / "home")
    sessions = store.sessions.list(report.run)
    assert len(sessions) == 4 and {s.status for s in sessions} == {"finished"}, [s.error for s in sessions]
    turns = store.turns.read(report.run, with_experts=False)
    assert len(turns) == 4 and all(len(t.generated_ids) > 0 for t in turns)
    assert all(t.sampling_params.get("max_new_tokens", 8) == 8 for t in turns)
    store.close()


def test_cli_reports_bad_config_and_unknown_resume_in_one_line(tmp_path) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_text("run: x\ndataset: {path: t.jsonl}\nagent: {kind: gpt-agent}\n")
    said = {}
    for args in (["--config", str(bad)], ["--resume", "no-such-run"], []):
        r = subprocess.run(
            [sys.executable, "-c", "from dressage.cli import main; main()", "rollout", *args],
            env=worker_env(tmp_path / "home"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, r.stderr
        said[" ".join(args)] = r.stderr
    assert "unknown kind 'gpt-agent'" in said[f"--config {bad}"]


def test_resume_rejects_a_changed_config(tmp_path) -> None:
    from dressage.rollout.worker import resolve_config

    write_tasks(tmp_path / "tasks.jsonl", LETTERS)
    cfg = write_config(tmp_path, "http://127.0.0.1:1", name="frozen")
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home")
    from dressage.rollout.config import load_config

    store.runs.create("frozen", {"rollout": load_config(cfg).snapshot()})
    resolved, _ = resolve_config(store, WorkerOptions(resume="frozen"))
    assert resolved.run == "frozen"
    changed = write_config(tmp_path, "http://127.0.0.1:1", name="frozen", sampling={"max_tokens": 99})
    with pytest.raises(ConfigError, match="differs from the frozen config of run 'frozen' in: sampling"):
        resolve_config(store, WorkerOptions(resume="frozen", config_path=str(changed)))
    store.close()


@pytest.mark.parametrize("provider", ["local", "e2b"])
async def test_answer_agent_run_on_other_sandbox_providers(
    tmp_path: Path, engine_url: str, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same worker run with the ``local`` provider and with ``e2b`` (against the local fake of
    E2B's wire protocol, reached the way a deployment configures the SDK: environment variables)."""
    with contextlib.ExitStack() as stack:
        if provider == "e2b":
            from tests.paddock.fake_e2b import FakeE2B

            fake = stack.enter_context(FakeE2B())
            monkeypatch.setenv("E2B_API_KEY", "e2b_fake")
            monkeypatch.setenv("E2B_API_URL", fake.url)
            monkeypatch.setenv("E2B_SANDBOX_URL", fake.url)
        write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
        cfg = write_config(tmp_path, engine_url, sandbox={"provider": provider})
        db_url = f"sqlite:///{tmp_path / 'log.db'}"
        report = await _run(tmp_path, db_url, cfg)
        store = open_store(db_url, tmp_path / "home")
        run = store.runs.get(report.run)
        sessions = store.sessions.list(run)
        assert len(sessions) == 4 and {s.status for s in sessions} == {"finished"}
        assert {s.sandbox for s in sessions} == {provider}
        turns = store.turns.read(run, with_experts=False)
        assert {t.session_id for t in turns} == {s.id for s in sessions}
        names = Counter(a.name for a in store.artifacts.list(run))
        assert names == {"agent.log": 4, "workspace.tar.gz": 4}
        assert run.config["rollout"]["sandbox"]["provider"] == provider
        store.close()


_PY_AGENT = (
    "python3 -c 'import json, os, urllib.request as u; e = os.environ; "
    'body = {"model": e["OPENAI_MODEL"], "messages": [{"role": "user", "content": e["DRESSAGE_PROMPT"]}]}; '
    'r = u.Request(e["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(), '
    'headers={"Authorization": "Bearer " + e["OPENAI_API_KEY"], "Content-Type": "application/json"}); '
    'print(json.load(u.urlopen(r))["choices"][0]["message"]["content"])\''
)


async def test_blackbox_agent_on_the_image_provider_through_the_proxy_socket(
    tmp_path: Path, engine_url: str, test_image, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sandbox: {provider: image}``: a blackbox agent (the image's own python3) reaches the proxy
    through the Unix socket without network, in the image's WorkingDir; turns, rewards, the agent's
    log and the workspace archive (with the image's files) are recorded as with bwrap."""
    import io
    import tarfile

    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
    sandbox = {"provider": "image", "image": test_image.oci, "network": False}
    cfg = write_config(tmp_path, engine_url, agent={"kind": "command", "command": _PY_AGENT}, sandbox=sandbox)
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    report = await _run(tmp_path, db_url, cfg)
    store = open_store(db_url, tmp_path / "home")
    run = store.runs.get(report.run)
    sessions = store.sessions.list(run)
    assert len(sessions) == 4 and {s.status for s in sessions} == {"finished"}, [s.error for s in sessions]
    assert {s.sandbox for s in sessions} == {"image"}
    turns = store.turns.read(run, with_experts=False)
    assert len(turns) == 4 and all(len(t.generated_ids) > 0 for t in turns)
    archives = [a for a in store.artifacts.list(run) if a.name == "workspace.tar.gz"]
    assert len(archives) == 4
    with tarfile.open(fileobj=io.BytesIO(store.artifacts.get(archives[0]))) as tar:
        assert tar.extractfile("./readme.txt").read() == b"from the image\n"
    assert run.config["rollout"]["sandbox"]["image"] == test_image.oci
    assert len(list((tmp_path / "cache/images/rootfs").glob("*/rootfs"))) == 1  # unpacked once
    store.close()


DOCKER_AGENT = (
    "import json, os, urllib.request as u\n"
    "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': os.environ['DRESSAGE_PROMPT']}]})\n"
    "req = u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body.encode(),\n"
    "                {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
    "print(json.load(u.urlopen(req, timeout=60))['choices'][0]['message']['content'])\n"
)


@pytest.mark.external  # a container engine outside the venv
@pytest.mark.parametrize("agent", ["answer", "command"])
async def test_rollout_in_docker_containers(tmp_path: Path, engine_url: str, agent: str) -> None:
    """Provider ``docker`` under the worker (tier external, on the engine found here): a whitebox agent,
    and a blackbox one whose program in the container reaches the proxy through the worker's socket
    (no network); every session's container is gone afterwards."""
    from dressage.paddock import container_engine as ce
    from tests.paddock.conftest import container_image

    image = await container_image()
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:2])
    spec = (
        {"kind": "command", "command": ["python3", "-c", DOCKER_AGENT]}
        if agent == "command"
        else {"kind": "answer"}
    )
    cfg = write_config(tmp_path, engine_url, agent=spec, sandbox={"provider": "docker", "image": image})
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    report = await _run(tmp_path, db_url, cfg)
    store = open_store(db_url, tmp_path / "home")
    run = store.runs.get(report.run)
    sessions = store.sessions.list(run)
    assert len(sessions) == 4 and {s.status for s in sessions} == {"finished"}, [s.error for s in sessions]
    assert {s.sandbox for s in sessions} == {"docker"} and run.config["sandbox_limits"] == "cgroup"
    turns = store.turns.read(run, with_experts=False)
    assert {t.session_id for t in turns} == {s.id for s in sessions}
    assert await ce.labelled(await ce.find_engine(), ce.LABEL_RUN, report.run) == []
    store.close()
