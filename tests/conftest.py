"""Shared fixtures (real SQLite and real PostgreSQL event logs) and the test tiers.

PostgreSQL is expected at ``DRESSAGE_TEST_PG_ADMIN_URL`` (default: the local server on 127.0.0.1:5432);
each test session creates its own randomly named databases (``dressage_test_<pid>_<random>``) and drops
them at its end, so concurrent sessions never share or drop each other's database.

Tiers (README, "Run the tests"): every test gets the markers of what it needs, set here from the
fixtures and parameters it uses and from the module it lives in (:data:`FIXTURE_TIERS`,
:data:`MODULE_TIERS`), plus explicit ``@pytest.mark.slow``. ``pytest -q`` runs the default tier (none of
the markers); ``--tier postgres`` (or ``browser``, ``slow``, ``external``, ``cloud``, several joined by
commas) runs only those; ``--tier all`` runs everything. Named files or test ids (``pytest
tests/store``) run every tier of what they name unless ``--tier`` is given. A test whose service is absent skips with the
reason; ``DRESSAGE_REQUIRE_ALL=1`` (set by CI) turns those skips into failures, except the ``cloud`` tier
(real E2B credentials are never on CI machines).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from typer.testing import CliRunner

    from dressage.store import EventStore
    from tests.dev_engine import RunningEngine
    from tests.paddock.images import BuiltImage
    from tests.quickstart_run import QuickstartRun

PG_ADMIN_URL = os.environ.get("DRESSAGE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_TEST_DB = os.environ.get("DRESSAGE_TEST_PG_DB", f"dressage_test_{os.getpid()}")
REQUIRE_ALL = os.environ.get("DRESSAGE_REQUIRE_ALL") == "1"
"""CI: a test of a tier whose service is absent fails instead of skipping (``cloud`` excepted)."""

TIERS = ("postgres", "browser", "slow", "external", "cloud")
"""Markers outside the default tier: PostgreSQL, headless Chromium, long drills (crash, replica,
Ray, the RL loop), CLIs and environments installed outside the venv, and real cloud credentials."""
FIXTURE_TIERS = {
    "pg_url": "postgres",
    "rollout_pg_url": "postgres",
    "cluster_pg_url": "postgres",
    "browser": "browser",
    "ray_cluster": "slow",
    "test_image": "slow",
}
"""A test that uses one of these fixtures (directly or through another fixture) gets the tier."""
PARAM_TIERS = {"postgresql": "postgres", "docker": "external"}
"""A test parametrized with one of these values (the backend of ``db_url``, ``any_db_url``, ``viewed``;
the provider of ``any_sandbox``: a container engine outside the venv)."""
MODULE_TIERS: dict[str, tuple[str, ...]] = {
    "tests/cluster/": ("slow",),
    "tests/loop/": ("slow",),
    "tests/recipes/test_textworld.py": ("slow",),
    "tests/recipes/test_recipe_runs.py": ("slow",),
    "tests/harbor/test_harbor_loop.py": ("slow",),
    "tests/rollout/test_crash_resume.py": ("slow",),
    "tests/rollout/test_inflight_resume.py": ("slow",),
    "tests/rollout/test_fork_crash.py": ("slow",),
    "tests/rollout/test_engine_failover.py": ("slow",),
    "tests/rollout/test_retry_failed.py": ("slow",),
    "tests/rollout/test_tree_rollout.py": ("slow",),
    "tests/store/test_server_crash.py": ("slow",),
    "tests/store/test_replica.py": ("slow", "postgres"),
    "tests/training/test_resume_cli.py": ("slow",),
    "tests/agents/test_native_clis.py": ("external",),
    "tests/agents/test_native_clis_rollout.py": ("external",),
    "tests/agents/test_native_clis_resume.py": ("external",),
    "tests/agents/test_native_clis_fork.py": ("external",),
    "tests/harbor/test_harbor_run.py": ("external",),
    "tests/harbor/test_harbor_tbench.py": ("external", "slow"),
    "tests/harbor/test_harbor_ubuntu.py": ("slow",),
    "tests/harbor/test_harbor_builders.py": ("external", "slow"),
    "tests/training/test_slime_contract.py": ("external",),
    "tests/paddock/test_e2b_cloud.py": ("cloud",),
    "tests/paddock/test_docker.py": ("external",),
}
"""Modules whose every test needs a tier (path prefixes relative to the repository)."""
REPO = Path(__file__).resolve().parents[1]
# What the fixtures below use (psycopg, the store and its migrations, typer's runner) is imported
# inside them, not here: every pytest process imports this module, and the child pytest sessions
# that tests start (tests/test_tiers.py: a few modules collected, small modules of its own run)
# would otherwise pay for SQLAlchemy, alembic and the store before collecting anything.


GC_THRESHOLDS = (10_000, 20, 50)
"""The cyclic garbage collector's thresholds in every pytest process (CPython's are 700, 10, 10).

An xdist worker of the default tier holds 0.9-1.1 million tracked objects once torch, transformers,
the Qwen3.5 vocabulary and a dev engine are loaded, and a full (generation 2) collection walks all of
them: with CPython's thresholds the three workers spent 29 s in the collector over one default-tier
run (7-13 s each, most of it in full collections of objects that live as long as the process), with
these 9 s. A young collection every 10,000 allocations and a full one 50 middle ones apart still
free every cycle, later (docs/test-speed.md)."""


def pytest_configure(config: pytest.Config) -> None:
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        default=None,
        help="default (no tier marker; the default unless -m is given), all, or tiers joined by commas: "
        + ", ".join(TIERS),
    )


def module_tiers(path: Path) -> set[str]:
    """The tiers :data:`MODULE_TIERS` gives every test under ``path`` (a module or a folder)."""
    path = path.resolve()
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.as_posix()
    rel += "/" if path.is_dir() else ""  # a folder's prefix ends with its slash
    return {tier for prefix, tiers in MODULE_TIERS.items() if rel.startswith(prefix) for tier in tiers}


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers a collected test belongs to (empty: the default tier)."""
    found = {m.name for m in item.iter_markers() if m.name in TIERS}
    found |= {FIXTURE_TIERS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_TIERS}
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        found |= {PARAM_TIERS[v] for v in callspec.params.values() if isinstance(v, str) and v in PARAM_TIERS}
    return found | module_tiers(Path(str(item.path)))


def wanted_tiers(config: pytest.Config) -> set[str]:
    """The tiers this session selects: ``--tier``'s, else the default tier for a bare ``pytest -q`` and
    every tier for named files or nodes or a ``-m`` expression."""
    tier = config.getoption("--tier")
    if tier is None:
        named = config.args_source == pytest.Config.ArgsSource.ARGS
        tier = "all" if named or config.getoption("markexpr") else "default"
    wanted = {t.strip() for t in tier.split(",") if t.strip()}
    unknown = wanted - {"default", "all", *TIERS}
    if unknown:
        raise pytest.UsageError(
            f"--tier {tier}: unknown tier(s) {sorted(unknown)}; use default, all or {TIERS}"
        )
    return wanted


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In a default-tier session, leave the modules (and folders) of :data:`MODULE_TIERS` unimported:
    each of their tests has a tier, so all would be deselected, and importing them costs every process
    that collects (each xdist worker) their imports (Ray for tests/cluster/, TextWorld, the agent CLIs'
    harnesses). Only there: another tier's session may want a test of such a module for a tier it gets
    from its fixtures or parameters (a loop drill on PostgreSQL is slow and postgres)."""
    if wanted_tiers(config) == {"default"} and module_tiers(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tiers, then keep those of ``--tier``."""
    wanted = wanted_tiers(config)
    kept, dropped = [], []
    for item in items:
        tiers = tiers_of(item)
        for name in sorted(tiers):
            item.add_marker(getattr(pytest.mark, name))
        keep = "all" in wanted or (not tiers and "default" in wanted) or bool(tiers & wanted)
        (kept if keep else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``DRESSAGE_REQUIRE_ALL=1``, a skipped test of a service tier (not ``cloud``) fails."""
    report = yield
    if REQUIRE_ALL and report.skipped and not item.get_closest_marker("cloud"):
        tiers = {m.name for m in item.iter_markers()} & {"postgres", "browser", "external", "slow"}
        if tiers:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = f"DRESSAGE_REQUIRE_ALL=1: a {'/'.join(sorted(tiers))} test skipped: {reason}"
    return report


@pytest.fixture(scope="session")
def test_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    """A small OCI image built offline with buildah (tests/paddock/images.py), once per test session
    (per xdist worker); the slow tier. Without skopeo, umoci or buildah the test skips, saying so."""
    from tests.paddock.images import build_test_image, missing_tools

    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    return build_test_image(tmp_path_factory.mktemp("image"))


def require_module(name: str, reason: str) -> ModuleType:
    """Import an optional extra's module for a test module (at its top) or a fixture: without it the
    caller skips, visibly to ``DRESSAGE_REQUIRE_ALL=1``, which fails instead (CI installs every extra).
    ``pytest.importorskip`` at a module's top would skip a whole folder whatever the tier."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        message = f"{reason} ({name}: {e})"
        if REQUIRE_ALL:
            pytest.fail(f"DRESSAGE_REQUIRE_ALL=1: {message}", pytrace=False)
        pytest.skip(message, allow_module_level=True)


ENGINE_EXTRA = "the dev engine needs the 'engine' extra (torch, transformers)"


def pg_unavailable(reason: str) -> None:
    """Skip (or, with ``DRESSAGE_REQUIRE_ALL=1``, fail) a test whose PostgreSQL is not there."""
    message = (
        f"PostgreSQL is not reachable at {PG_ADMIN_URL} ({reason}); start it (see .ci/run) "
        "or point DRESSAGE_TEST_PG_ADMIN_URL at a server"
    )
    if REQUIRE_ALL:
        pytest.fail(message)
    pytest.skip(message)


def create_pg_database(name: str) -> str:
    """Create a fresh database named ``name`` plus a random suffix on the test server and migrate it;
    returns its SQLAlchemy URL. No database is ever dropped by name before use: the random suffix
    keeps concurrent test sessions (pytest-xdist workers, helpers on one machine) apart."""
    import psycopg

    name = f"{name}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:
        pg_unavailable(str(e).strip().splitlines()[0])
    _CREATED.append(name)
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    url = f"{base}/{name}"
    from dressage.store.db import upgrade  # here: a test skipped for want of a server needs no store

    upgrade(url)
    return url


_CREATED: list[str] = []
"""Databases this test session created (dropped at its end)."""


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the databases this session created (only those: others may be in use), then the roles
    it made in them (``tests/pg_roles.py``)."""
    if not _CREATED:
        return
    import psycopg

    from tests.pg_roles import drop_created_roles

    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            for name in _CREATED:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            drop_created_roles(conn)
    except psycopg.OperationalError:
        pass  # the server went away: nothing left to clean
    _CREATED.clear()


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A freshly created, migrated PostgreSQL database for this test session (dropped at its end)."""
    return create_pg_database(PG_TEST_DB)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database file for this test session."""
    from dressage.store.db import upgrade

    path = tmp_path_factory.mktemp("sqlite") / "dressage.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend in turn: the same tests run on SQLite and PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def rollout_pg_url() -> str:
    """A second PostgreSQL database, for the rollout and Harbor tests (their workers write whole runs)."""
    return create_pg_database("dressage_rollout_test")


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh SQLite file, or the rollout PostgreSQL database: rollout tests run on both."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("rollout_pg_url"))
    return f"sqlite:///{tmp_path / 'log.db'}"


@pytest.fixture
def store(db_url: str, tmp_path: Path) -> Iterator[EventStore]:
    """An :class:`EventStore` on each backend, with a local artifact directory."""
    from tests.stores import open_store

    with open_store(db_url, tmp_path / "home") as s:
        yield s


@pytest.fixture
def run_name() -> str:
    """A fresh run name (tests share a database per backend)."""
    return f"run-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def anyio_backend() -> str:
    """The anyio plugin's tests run on asyncio only."""
    return "asyncio"


@pytest.fixture
def cli() -> CliRunner:
    """A runner for the ``dressage-worker`` app (stderr kept apart from stdout, wide, no colour)."""
    from typer.testing import CliRunner

    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture(scope="session")
def engine() -> Iterator[RunningEngine]:
    """The dev engine (tiny model, seed 0) served in a thread of this process, shared by the session."""
    torch = require_module("torch", ENGINE_EXTRA)
    require_module("transformers", ENGINE_EXTRA)
    from tests.dev_engine import serve_tiny_engine

    torch.set_num_threads(1)
    yield from serve_tiny_engine(seed=0)


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """The dev engine (tiny model, seed 0) as ``dressage-worker engine`` in a child process, shared by
    the session: rollout workers in other processes point at it."""
    require_module("torch", ENGINE_EXTRA)
    import asyncio

    from dressage.rollout.engine_process import DevEngineProcess

    engine = DevEngineProcess("tiny", seed=0)
    url = asyncio.run(engine.start())
    yield url
    engine.stop()


@pytest.fixture(scope="session")
def readme_quickstart(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> QuickstartRun:
    """The README's quickstart command run once per test run, as printed, in a folder of its own
    (``tests/quickstart_run.py``); its tests check the exit status themselves. Under xdist the first
    worker to need it runs it and the others read its result (a file lock in the run's shared
    temporary directory), so the 60-session quickstart runs once, not once per worker."""
    from tests.paddock.conftest import bwrap_unavailable_reason
    from tests.quickstart_run import shared_readme_quickstart
    from tests.shared_runs import run_root

    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the quickstart needs bubblewrap: {reason}")
    return shared_readme_quickstart(run_root(request.config, tmp_path_factory))
