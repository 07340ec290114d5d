"""Fixtures for the viewer's browser tests: a real run, a multi-lineage session, the viewer served
on loopback, and headless Chromium driven by Selenium.

Per backend (SQLite, PostgreSQL) one log holds:
* run ``quick-<backend>``: a real rollout (CPU dev engine, bubblewrap, a Python agent that answers
  with one model call and crashes on the task labelled ``crash``): 3 tasks x 2 samples, so 4
  finished sessions in 2 groups and 2 failed ones; then a trainer (no backend) records its steps;
* run ``multi-<backend>``: :func:`tests.view.builders.build_multi_session` (6 turns, 5 segments,
  2 lineages, hostile text and a secret);
* run ``eval-<backend>``: :func:`tests.view.builders.build_eval_run` (training and eval sessions
  sharing group 0).
The viewer reads the log through its own read-only connection; the test's writer store is the
"log" the assertions compare against.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console
from starlette.applications import Starlette

from dressage.config import Settings
from dressage.rollout.worker import WorkerOptions, run_rollout
from dressage.store import EventStore
from dressage.training import StepOptions, Trainer
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from dressage.view.server import ViewServer
from tests.conftest import create_pg_database
from tests.loopback import ThreadedServer
from tests.paddock.conftest import bwrap_unavailable_reason
from tests.rollout.conftest import write_config, write_tasks
from tests.view.builders import EvalRun, MultiSession, build_eval_run, build_multi_session

CHROMIUM = os.environ.get("DRESSAGE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DRESSAGE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
TASKS = [
    {"prompt": "Reply with a word that contains 'e'.", "label": "e"},
    {"prompt": "Reply with a word that contains 'a'.", "label": "a"},
    {"prompt": "This one crashes the agent.", "label": "crash"},
]


@dataclass
class ViewedLog:
    """One backend's log, the writer store on it, and the viewer serving it."""

    backend: str
    url: str
    home: Path
    store: EventStore
    quick: str
    multi: MultiSession
    base: str
    evals: EvalRun


def serve(app: Starlette) -> ThreadedServer:
    """The viewer app on loopback, served as ``dressage-worker view`` serves it (not started)."""
    return ThreadedServer(app, server=lambda config: ViewServer(config, app.state.live))


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium (Debian's ``chromium`` + ``chromium-driver``, see scripts/setup_browser.sh)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        # the browser tier skips without Chromium (DRESSAGE_REQUIRE_ALL=1 turns the skip into a failure)
        pytest.skip(
            f"the viewer's browser tests need {CHROMIUM} and {CHROMEDRIVER}: run scripts/setup_browser.sh "
            "(apt packages chromium, chromium-driver) or set DRESSAGE_TEST_CHROMIUM/CHROMEDRIVER"
        )
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _quick_run(url: str, home: Path, engine: str, name: str) -> None:
    work = home / "quick"
    work.mkdir(parents=True)
    write_tasks(work / "tasks.jsonl", TASKS)
    cfg = write_config(
        work,
        engine,
        name=name,
        n_samples_per_prompt=2,
        agent={"kind": "python", "path": "tests.rollout.agents_for_tests:CrashingAgent"},
        worker={"max_attempts": 1},
        sampling={"max_tokens": 6, "enable_thinking": False, "seed": 0},
    )
    settings = Settings(database_url=url, home=home)
    options = WorkerOptions(config_path=str(cfg), show_progress=False)
    asyncio.run(run_rollout(settings, options, Console(stderr=True, quiet=True)))


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def viewed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, engine_url: str
) -> Iterator[ViewedLog]:
    """The log of one backend with both runs, and the viewer serving it on loopback."""
    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the quickstart-style run needs bubblewrap: {reason}")
    backend = request.param
    home = tmp_path_factory.mktemp(f"view-{backend}")
    if backend == "postgresql":
        url = create_pg_database(f"dressage_view_test_{os.getpid()}")
    else:
        url = f"sqlite:///{home / 'dressage.db'}"
    settings = Settings(database_url=url, home=home)
    suffix = uuid.uuid4().hex[:6]
    quick = f"quick-{backend}-{suffix}"
    _quick_run(url, home, engine_url, quick)
    store = EventStore.open(settings=settings)
    Trainer(store, quick, StepOptions(global_batch_size=2, n_samples_per_prompt=2)).run_steps()
    multi = build_multi_session(store, f"multi-{backend}-{suffix}")
    evals = build_eval_run(store, f"eval-{backend}-{suffix}")
    viewer_store = open_readonly_store(settings)
    server = serve(create_app(viewer_store))
    server.start()
    yield ViewedLog(backend, url, home, store, quick, multi, server.base, evals)
    server.stop()
    viewer_store.close()
    store.close()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_console(request: pytest.FixtureRequest) -> None:
    """Each browser test starts on a blank page with an empty console log, so it sees only its own
    page's errors: the log is built first (minutes, on a backend's first test), then the previous
    test's page is left (its event stream with it: a page left open on a viewer that has stopped
    would log its refused reconnects into this test) and the log drained."""
    if "browser" in request.fixturenames:
        if "viewed" in request.fixturenames:
            request.getfixturevalue("viewed")
        browser = request.getfixturevalue("browser")
        browser.get("about:blank")
        browser.get_log("browser")
