"""The SWE recipe end to end from a fresh folder, with the commands its README prints for the CPU
(slow tier): the oracle scores 1 on every instance, its SFT export is a dataset of conversations with
the tool call and its result, the tiny model's rollout finishes, one ``loop`` iteration commits a
training step; the oracle's wrong mode scores 0 and its tamper mode 0 with the integrity check's
reason; the viewer's session page shows the tool call, its result and the reward's verdict.

As tests/test_readme_newcomer.py: the ``.venv/bin/`` lines of recipes/swe/README.md ("On the CPU")
run with bash as printed, in a folder holding only ``.venv`` (a link to this venv) and a copy of
``recipes/`` (without built repositories), with this checkout's code on ``PYTHONPATH``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.conftest import require_module

require_module("swebench", "the SWE recipe needs the 'swe' extra")

from dressage.config import Settings  # noqa: E402
from dressage.store import EventStore  # noqa: E402
from dressage.view.app import create_app  # noqa: E402
from dressage.view.readonly import open_readonly_store  # noqa: E402
from tests.paddock.conftest import requires_bwrap  # noqa: E402
from tests.recipes.swe_fixtures import requires_sandbox_pytest  # noqa: E402
from tests.view.conftest import serve  # noqa: E402

pytestmark = [requires_bwrap, requires_sandbox_pytest, pytest.mark.slow, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
README = REPO / "recipes" / "swe" / "README.md"


def cpu_commands() -> list[str]:
    """The ``.venv/bin/`` lines of the README's "On the CPU" section, in order."""
    section = README.read_text(encoding="utf-8").split("## On the CPU", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split("  #", 1)[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
        for line in block.splitlines()
    ]
    return [line for line in lines if line.startswith(".venv/bin/")]


def _run(work: Path, command: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh folder where the README's CPU commands ran as printed."""
    work = tmp_path_factory.mktemp("swe")
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "recipes", work / "recipes", ignore=shutil.ignore_patterns("__pycache__", "repos"))
    commands = cpu_commands()
    assert [c.split()[1] for c in commands] == ["-m", "rollout", "export", "rollout", "loop", "runs"]
    for command in commands:
        _run(work, command)
    return work


def _store(work: Path) -> EventStore:
    return EventStore.open(f"sqlite:///{work / '.dressage' / 'dressage.db'}")


def _rewards(work: Path, run: str) -> list[dict]:
    store = _store(work)
    try:
        return [e.payload for e in store.events.read(store.runs.get(run), kinds=("reward",))]
    finally:
        store.close()


def test_the_oracle_scores_1_on_every_instance(work: Path) -> None:
    rewards = _rewards(work, "swe-oracle")
    assert len(rewards) == 4 and {r["reward"] for r in rewards} == {1.0}
    assert {r["details"]["status"] for r in rewards} == {"RESOLVED_FULL"}


def test_the_oracle_export_is_an_sft_dataset_with_the_tool_call_and_its_result(work: Path) -> None:
    rows = pq.read_table(work / ".dressage" / "swe-sft" / "sft.parquet").to_pylist()
    assert len({r["session_id"] for r in rows}) == 4 and all(r["reward"] == 1.0 for r in rows)
    messages = [m for r in rows for m in r["messages"]]
    calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    assert {c["function"]["name"] for c in calls} == {"run"}
    assert all("git apply" in c["function"]["arguments"]["command"] for c in calls)
    assert any(m["role"] == "tool" and "Applied patch" in (m["content"] or "") for m in messages)


def test_the_tiny_model_rollout_and_one_loop_iteration_commit_a_step(work: Path) -> None:
    store = _store(work)
    try:
        rollout = store.runs.summary("swe")
        loops = [
            r for r in store.runs.list() if r.name not in ("swe", "swe-oracle") and r.name.startswith("swe")
        ]
        steps = {r.name: len(store.consumers.steps(r, "train:loop")) for r in loops}
    finally:
        store.close()
    assert rollout.sessions == {"finished": 8} and rollout.mean_reward is not None
    assert steps.get("swe-sync", 0) >= 1, steps


@pytest.mark.parametrize("mode", ["wrong", "tamper"])
def test_the_wrong_and_tampering_oracles_score_0(work: Path, mode: str) -> None:
    folder = work / "recipes" / "swe"
    text = (folder / "oracle.yaml").read_text(encoding="utf-8")
    changed = text.replace("run: swe-oracle", f"run: swe-{mode}").replace("mode: correct", f"mode: {mode}")
    assert f"mode: {mode}" in changed and changed.count(f"swe-{mode}") == 1
    (folder / f"{mode}.yaml").write_text(changed, encoding="utf-8")
    _run(work, f".venv/bin/dressage-worker rollout --config recipes/swe/{mode}.yaml")
    rewards = _rewards(work, f"swe-{mode}")
    assert len(rewards) == 4 and {r["reward"] for r in rewards} == {0.0}
    details = [r["details"] for r in rewards]
    if mode == "wrong":
        assert {d["status"] for d in details} == {"RESOLVED_NO"} and {d["integrity"] for d in details} == {
            "ok"
        }
    else:
        assert {d["status"] for d in details} == {"INTEGRITY_FAILED"}
        assert all("a file of the test patch" in d["reason"] for d in details), json.dumps(details)[:2000]


def test_the_viewer_shows_the_tool_call_its_result_and_the_verdict(work: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{work / '.dressage' / 'dressage.db'}", home=work / ".dressage"
    )
    store = _store(work)
    try:
        sessions = [s.id for s in store.sessions.list("swe-oracle")]
    finally:
        store.close()
    viewer_store = open_readonly_store(settings)
    server = serve(create_app(viewer_store))
    server.start()
    try:
        pages = [html.unescape(httpx.get(f"{server.base}/session", params={"id": s}).text) for s in sessions]
    finally:
        server.stop()
        viewer_store.close()
    assert len(pages) == 4
    assert all("git apply" in p and "Applied patch" in p and "RESOLVED_FULL" in p for p in pages)
