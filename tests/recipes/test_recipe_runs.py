"""Each recipe end to end, from a fresh folder, with the commands its README prints for the CPU (slow
tier): the oracle run scores 1 on every task, its SFT export is a dataset of conversations with tool
calls and results, the tiny model's rollout finishes, one `loop` iteration commits a training step;
the oracle's wrong mode scores 0; the viewer's session page, in headless Chromium, shows the tool
calls and their results.

As tests/test_readme_newcomer.py: the commands are parsed from recipes/NAME/README.md ("On the CPU")
and run with bash as printed, in a folder holding only ``.venv`` (a link to this venv) and a copy of
``recipes/``, with this checkout's code on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from tests.conftest import require_module
from tests.shared_runs import run_root, shared_folder
from tests.view.browser import one, text, url, wait
from tests.view.conftest import serve

pytestmark = pytest.mark.timeout(1800)
REPO = Path(__file__).resolve().parents[2]
WORKER = ".venv/bin/dressage-worker"


@dataclass(frozen=True)
class Recipe:
    """What each recipe's run must show."""

    name: str
    extra_module: str
    tasks: int
    tool: str
    result_text: str
    """A tool result's text the oracle's conversation holds (in the SFT rows and the viewer)."""
    unavailable: Callable[[], str | None] | None = None
    """Why a tool outside the venv that the recipe's sandboxes need is missing, or None."""


def _sandbox_pytest() -> str | None:
    from tests.recipes.swe_fixtures import sandbox_pytest_missing

    return sandbox_pytest_missing()


RECIPES = {
    "hotpotqa": Recipe("hotpotqa", "bm25s", 6, "search", "He was born in 1874 in Cheltenham"),
    "textworld": Recipe(
        "textworld", "textworld", 4, "act", "[score 1/1, moves 2] The game is over: you won."
    ),
    "swe": Recipe("swe", "swebench", 4, "run", "Applied patch", _sandbox_pytest),
}
SETUP = ".venv/bin/python -m recipes."
"""A README's CPU line that prepares the recipe's data (the SWE sample's repositories) before the runs."""


def cpu_commands(recipe: str) -> list[str]:
    """The ``.venv/bin/dressage-worker`` lines of the README's "On the CPU" section, after its
    set-up lines (``.venv/bin/python -m recipes....``), in order."""
    readme = (REPO / "recipes" / recipe / "README.md").read_text(encoding="utf-8")
    section = readme.split("## On the CPU", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split("  #", 1)[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
        for line in block.splitlines()
    ]
    return [line for line in lines if line.startswith((WORKER, SETUP))]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _run(work: Path, command: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", command], cwd=work, env=_env(), capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"$ {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module", params=sorted(RECIPES))
def ran(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Recipe, Path]]:
    """A fresh folder where the recipe's README commands ran as printed, once per test run: under
    xdist the first worker to need it runs them, the others wait and read the same folder
    (tests/shared_runs.py; the tests read the log, and the wrong-oracle test adds a run of its own)."""
    from tests.paddock.conftest import bwrap_unavailable_reason

    recipe = RECIPES[request.param]
    require_module(recipe.extra_module, f"the {recipe.name} recipe needs the '{recipe.name}' extra")
    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the recipes' configs use bubblewrap: {reason}")
    missing = recipe.unavailable() if recipe.unavailable else None
    if missing is not None:
        pytest.skip(missing)
    root = run_root(request.config, tmp_path_factory)
    yield recipe, shared_folder(root, f"recipe-{recipe.name}", lambda work: _run_readme(recipe, work))


def _run_readme(recipe: Recipe, work: Path) -> None:
    """Lay out ``work`` (``.venv`` and a copy of ``recipes/``) and run the recipe's README commands."""
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    # without built data (the SWE sample's repositories): the README's set-up lines make them
    shutil.copytree(REPO / "recipes", work / "recipes", ignore=shutil.ignore_patterns("__pycache__", "repos"))
    commands = cpu_commands(recipe.name)
    runs = [c.split()[1] for c in commands if c.startswith(WORKER)]
    assert runs == ["rollout", "export", "rollout", "loop", "runs"]
    assert commands[len(commands) - len(runs) :] == [c for c in commands if c.startswith(WORKER)]
    for command in commands:
        _run(work, command)


def _store(work: Path) -> EventStore:
    return EventStore.open(f"sqlite:///{work / '.dressage' / 'dressage.db'}")


def test_the_oracle_scores_1_on_every_task(ran: tuple[Recipe, Path]) -> None:
    recipe, work = ran
    store = _store(work)
    try:
        summary = store.runs.summary(f"{recipe.name}-oracle")
    finally:
        store.close()
    assert summary.sessions == {"finished": recipe.tasks} and summary.mean_reward == 1.0


def test_the_oracle_export_is_an_sft_dataset_with_tool_calls_and_results(ran: tuple[Recipe, Path]) -> None:
    recipe, work = ran
    rows = pq.read_table(work / ".dressage" / f"{recipe.name}-sft" / "sft.parquet").to_pylist()
    assert len({r["session_id"] for r in rows}) == recipe.tasks
    messages = [m for r in rows for m in r["messages"]]
    calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    assert calls and {c["function"]["name"] for c in calls} >= {recipe.tool}
    assert any(m["role"] == "tool" and recipe.result_text in (m["content"] or "") for m in messages)
    assert all(r["reward"] == 1.0 for r in rows)


def test_the_tiny_model_rollout_and_one_loop_iteration_commit_a_step(ran: tuple[Recipe, Path]) -> None:
    recipe, work = ran
    store = _store(work)
    try:
        rollout = store.runs.summary(recipe.name)
    finally:
        store.close()
    with sqlite3.connect(work / ".dressage" / "dressage.db") as db:
        steps = db.execute(
            "SELECT r.name, COUNT(*) FROM train_steps s JOIN runs r ON r.id = s.run_id "
            "WHERE r.name LIKE ? GROUP BY r.name",
            (f"{recipe.name}-%",),
        ).fetchall()
    assert rollout.sessions == {"finished": 2 * recipe.tasks} and rollout.mean_reward is not None
    assert [(name, n) for name, n in steps if not name.endswith("-oracle")] and all(n >= 1 for _, n in steps)


def test_the_wrong_oracle_scores_0(ran: tuple[Recipe, Path]) -> None:
    recipe, work = ran
    folder = work / "recipes" / recipe.name
    text = (folder / "oracle.yaml").read_text(encoding="utf-8")
    wrong = text.replace(f"run: {recipe.name}-oracle", f"run: {recipe.name}-wrong").replace(
        "mode: correct", "mode: wrong"
    )
    assert wrong.count("-wrong") == 1 and "mode: wrong" in wrong
    (folder / "wrong.yaml").write_text(wrong, encoding="utf-8")
    _run(work, f"{WORKER} rollout --config recipes/{recipe.name}/wrong.yaml")
    store = _store(work)
    try:
        summary = store.runs.summary(f"{recipe.name}-wrong")
    finally:
        store.close()
    assert summary.sessions == {"finished": recipe.tasks} and summary.mean_reward == 0.0


def test_the_viewer_shows_the_tool_calls_and_their_results(ran: tuple[Recipe, Path], browser: Any) -> None:
    """Each oracle session's page, rendered by headless Chromium, shows the tool's name and a result."""
    recipe, work = ran
    settings = Settings(
        database_url=f"sqlite:///{work / '.dressage' / 'dressage.db'}", home=work / ".dressage"
    )
    store = _store(work)
    try:
        sessions = [s.id for s in store.sessions.list(f"{recipe.name}-oracle")]
    finally:
        store.close()
    viewer_store = open_readonly_store(settings)
    server = serve(create_app(viewer_store))
    server.start()
    try:
        pages = []
        for s in sessions:
            browser.get(url(server.base, "/session", id=s))
            pages.append(text(wait(browser, lambda d: one(d, "body"))))
    finally:
        server.stop()
        viewer_store.close()
    assert all(f"{recipe.tool}" in page for page in pages)
    assert any(recipe.result_text in page for page in pages)
