"""The README quickstart, run as printed, then opened in the viewer: the run page's "Reward by policy
version" shows for v0 the mean reward that ``dressage-worker runs`` and the run header show, and,
the quickstart being seeded, the README's 0.458."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from tests.quickstart_run import REPO, quickstart_commands
from tests.view.browser import css, one, severe_console_errors, text, url, wait
from tests.view.conftest import serve

pytestmark = pytest.mark.timeout(900)

README_V0 = "0.458"
"""The quickstart's mean reward at policy version 0, as README.md's loop table prints it."""


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A folder where the README's quickstart command ran as printed; the viewer serving its log."""
    from tests.paddock.conftest import bwrap_unavailable_reason

    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the quickstart needs bubblewrap: {reason}")
    work = tmp_path_factory.mktemp("quickstart")
    first, _ = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "examples", work / "examples")
    done = subprocess.run(
        ["bash", "-c", first], cwd=work, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"$ {first}\n{done.stdout}\n{done.stderr}"
    settings = Settings(
        database_url=f"sqlite:///{work / '.dressage' / 'dressage.db'}", home=work / ".dressage"
    )
    viewer_store = open_readonly_store(settings)
    server = serve(create_app(viewer_store))
    server.start()
    yield work, server.base
    server.stop()
    viewer_store.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_the_quickstart_run_page_shows_the_v0_reward_of_the_log(
    quickstart: tuple[Path, str], browser
) -> None:
    work, base = quickstart
    listed = subprocess.run(
        [".venv/bin/dressage-worker", "runs", "--json"], cwd=work, env=_env(), capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    [record] = [r for r in json.loads(listed.stdout) if r["run"] == "quickstart"]
    store = EventStore.open(f"sqlite:///{work / '.dressage' / 'dressage.db'}")
    try:
        summary = store.runs.summary("quickstart")
        versions = {s.id: s for s in store.sessions.list("quickstart")}
    finally:
        store.close()
    assert record["mean_reward"] == summary.mean_reward
    browser.get(url(base, "/run", name="quickstart"))
    row = wait(browser, lambda d: css(d, '#by-version tbody tr[data-version="0"]'))[0]
    shown_v0 = text(one(row, ".train"))
    # the quickstart samples once, with policy 0: the v0 training mean is the run's mean reward
    assert len(css(browser, "#by-version tbody tr")) == 1 and len(versions) == 60
    assert float(shown_v0) == float(f"{record['mean_reward']:.4g}")
    assert float(text(one(browser, "#mean-reward"))) == float(f"{summary.mean_reward:.3g}")
    assert f"{float(shown_v0):.3f}" == README_V0  # seeded sampling: the README's figure (3 places)
    assert not severe_console_errors(browser)
