"""The test tiers (issue 26, point 11): markers set from the fixtures a test uses, selected by --tier.

Collected by pytest in a child process on a few real modules (collection only: nothing runs): a test of the
store on PostgreSQL is in the postgres tier and its SQLite twin in the default one; a browser fixture,
an agent CLI module and the E2B cloud module land in their tiers; unknown markers are refused.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = [
    "tests/cli/test_store_commands.py",
    "tests/view/test_pages.py",
    "tests/agents/test_native_clis.py",
    "tests/paddock/test_e2b_cloud.py",
]


ARGUMENTS = (
    ("--tier", "default"),
    ("--tier", "postgres"),
    ("--tier", "browser"),
    ("--tier", "external"),
    ("--tier", "cloud"),
    ("--tier", "all"),
    ("--tier", "default,postgres"),
    (),
    ("-m", "postgres"),
)
"""Every selection these tests compare among :data:`MODULES`, collected in one child process (imports
paid once)."""
FOLDER = "tests/paddock/"
"""A folder holding a module of :data:`MODULE_TIERS <tests.conftest.MODULE_TIERS>` (test_docker.py, external)."""
FOLDER_ARGUMENTS = (("--tier", "default"), ("--tier", "external"))
"""Selections collected over :data:`FOLDER` (by the same child process)."""
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio")
"""Installed pytest plugins that the child sessions of one small module each have no use for (none of
their tests is async or a Hypothesis property): loading them would cost every child pytest (and each
xdist worker) about half a second of CPU, anyio's importing trio and Hypothesis's importing itself at
the session's end. The collection child (:data:`COLLECT`) drops Hypothesis's only: its modules' async
tests carry anyio's marker."""


def child_pytest(*args: str) -> list[str]:
    """The argv of a child ``pytest -q -rs`` over one small module, without the cache or unused plugins,
    with its temporary directory in the working directory (the test's ``tmp_path``): a child given none
    would number one of its own under the system's temporary directory and, doing so, delete the oldest
    of the numbered ones there (pytest keeps three), which may be a whole earlier test run's (gigabytes:
    seconds of this test's time)."""
    return [
        *(sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *UNUSED_PLUGINS),
        *("--basetemp", "child-basetemp", *args),
    ]


COLLECT = """
import gc, json, sys
import pytest

class Selected:
    def __init__(self):
        self.dropped = []

    def pytest_deselected(self, items):
        self.dropped += [item.nodeid for item in items]

    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

found = []
for args, paths in json.loads(sys.argv[1]):
    gc.freeze()  # pytest collects garbage as each session ends: leave what earlier sessions imported alone
    selected = Selected()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args, *paths],
        plugins=[selected],
    )
    found.append([int(code), getattr(selected, "ids", []), selected.dropped])
print(json.dumps(found))
"""


@functools.cache
def all_collected() -> dict[str, tuple[list[str], list[str]]]:
    """Node ids that ``pytest --collect-only ARGS PATHS`` selects and deselects, for each of
    :data:`ARGUMENTS` over :data:`MODULES` (keyed by ARGS) and of :data:`FOLDER_ARGUMENTS` over
    :data:`FOLDER` (keyed by ARGS and the folder): one child process runs ``pytest.main`` once per
    selection."""
    selections = {" ".join(args): (args, MODULES) for args in ARGUMENTS}
    selections |= {" ".join([*args, FOLDER]): (args, [FOLDER]) for args in FOLDER_ARGUMENTS}
    cmd = [sys.executable, "-c", COLLECT, json.dumps(list(selections.values()))]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    for key, (code, _, _) in zip(selections, found, strict=True):
        assert code in (0, 5), f"pytest --collect-only {key} exited {code}:\n{out.stdout}"
    return {key: (ids, dropped) for key, (_, ids, dropped) in zip(selections, found, strict=True)}


def collected(*args: str) -> list[str]:
    """Node ids ``pytest --collect-only ARGS`` selects among :data:`MODULES`."""
    return all_collected()[" ".join(args)][0]


def deselected(*args: str) -> list[str]:
    """Node ids ``pytest --collect-only ARGS`` collected among :data:`MODULES` and then deselected."""
    return all_collected()[" ".join(args)][1]


def test_the_default_tier_holds_sqlite_tests_only() -> None:
    default = collected("--tier", "default")
    assert default, "the default tier selected nothing"
    assert all("postgresql" not in node for node in default)
    assert any("[sqlite]" in node for node in default)
    assert not any(m in node for node in default for m in MODULES[1:])


def test_each_tier_gets_its_tests() -> None:
    postgres = collected("--tier", "postgres")
    assert postgres and all("postgresql" in node for node in postgres)
    browser = collected("--tier", "browser")
    assert browser and all(node.startswith(MODULES[1]) for node in browser)
    external = collected("--tier", "external")
    assert external and all(node.startswith(MODULES[2]) for node in external)
    cloud = collected("--tier", "cloud")
    assert cloud and all(node.startswith(MODULES[3]) for node in cloud)
    everything = collected("--tier", "all")
    assert len(everything) == len(set(everything)) >= len(set(postgres + browser + external + cloud))
    assert set(collected("--tier", "default,postgres")) == set(collected("--tier", "default")) | set(postgres)
    assert set(collected()) == set(everything)  # named modules without --tier: every tier of them


def test_the_default_tier_does_not_import_modules_whose_every_test_has_a_tier() -> None:
    """Collecting tests/paddock/ for the default tier leaves test_docker.py (external, by MODULE_TIERS)
    unimported: none of its tests was even deselected; the image provider's twins elsewhere in the
    folder were. Collected for the external tier, its tests are selected. A module named on the command line
    is always collected (the other tests here name test_native_clis.py, external too)."""
    docker = f"{FOLDER}test_docker.py"
    default_kept, default_dropped = all_collected()[f"--tier default {FOLDER}"]
    assert default_kept and not any(n.startswith(docker) for n in default_kept + default_dropped)
    assert any(n.endswith("[image]") for n in default_dropped)  # the image provider's (slow) twins
    assert any(n.startswith(docker) for n in all_collected()[f"--tier external {FOLDER}"][0])
    assert any(n.startswith(MODULES[2]) for n in deselected("--tier", "default"))


def test_an_explicit_marker_expression_selects_across_tiers() -> None:
    assert set(collected("-m", "postgres")) == set(collected("--tier", "postgres"))


def test_unknown_markers_and_tiers_are_refused(tmp_path: Path) -> None:
    bad = subprocess.run(
        # the refusal comes after collection, whatever is collected: this module imports nothing heavy
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            *UNUSED_PLUGINS,
            "--tier",
            "nightly",
            __file__,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "unknown tier(s) ['nightly']" in bad.stdout + bad.stderr
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'addopts = "--strict-markers"' in pyproject


def test_without_postgresql_the_tier_skips_and_ci_turns_the_skip_into_a_failure(tmp_path: Path) -> None:
    """A test using the ``pg_url`` fixture when no server answers: skipped with the reason, failed under
    ``DRESSAGE_REQUIRE_ALL=1``. The test lives in a module of its own (the hooks and the fixture are
    this conftest's), so the child sessions import nothing of the product but the fixture's needs."""
    import os

    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pg_url, pytest_addoption, pytest_collection_modifyitems, "
        "pytest_runtest_makereport\n"
        '__all__ = ["pg_url", "pytest_addoption", "pytest_collection_modifyitems", "pytest_runtest_makereport"]\n'
    )
    (tmp_path / "test_on_postgres.py").write_text(
        "def test_needs_the_server(pg_url: str) -> None:\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["DRESSAGE_TEST_PG_ADMIN_URL"] = "postgresql://postgres@127.0.0.1:1/postgres"
    env.pop("DRESSAGE_REQUIRE_ALL", None)
    cmd = child_pytest("test_on_postgres.py")
    skipped = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "PostgreSQL is not reachable at postgresql://postgres@127.0.0.1:1/postgres" in skipped.stdout
    env["DRESSAGE_REQUIRE_ALL"] = "1"
    failed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and "PostgreSQL is not reachable" in failed.stdout, failed.stdout


def test_under_xdist_workers_keep_the_tiers_and_turn_skips_into_failures(tmp_path: Path) -> None:
    """xdist workers (the README runs ``-n 3``): this conftest's hooks run in each worker (tier selection without
    arguments, and a service tier's skip failing under ``DRESSAGE_REQUIRE_ALL=1``)."""
    import os

    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_addoption, pytest_collection_modifyitems, pytest_runtest_makereport\n"
        '__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "pytest_runtest_makereport"]\n'
    )
    (tmp_path / "test_tiered.py").write_text(
        "import pytest\n\n\n@pytest.mark.postgres\ndef test_needs_a_service() -> None:\n"
        '    pytest.skip("the service is absent")\n\n\ndef test_default() -> None:\n    pass\n'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRESSAGE_REQUIRE_ALL", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = child_pytest("-n", "2", *args)
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    default = run()  # no arguments: the default tier only
    assert default.returncode == 0 and "1 passed" in default.stdout, default.stdout + default.stderr
    assert "skipped" not in default.stdout
    env["DRESSAGE_REQUIRE_ALL"] = "1"
    on_ci = run("--tier", "all")
    assert on_ci.returncode == 1, on_ci.stdout + on_ci.stderr
    assert "DRESSAGE_REQUIRE_ALL=1: a postgres test skipped: " in on_ci.stdout, on_ci.stdout
    assert "the service is absent" in on_ci.stdout and "1 failed, 1 passed" in on_ci.stdout


def test_a_missing_extra_skips_a_module_and_fails_it_on_ci(tmp_path: Path) -> None:
    """``require_module`` at a module's top (tests/engines, tests/proxy, tests/loop): a skip without the
    extra, a collection error under ``DRESSAGE_REQUIRE_ALL=1`` (CI installs every extra)."""
    import os

    (tmp_path / "test_needs_extra.py").write_text(
        "from tests.conftest import require_module\n\n"
        'require_module("dressage_no_such_extra", "the made-up extra")\n\n\n'
        "def test_nothing() -> None:\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRESSAGE_REQUIRE_ALL", None)
    cmd = child_pytest("test_needs_extra.py")
    skipped = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert skipped.returncode in (0, 5) and "1 skipped" in skipped.stdout, skipped.stdout + skipped.stderr
    assert "the made-up extra (dressage_no_such_extra" in skipped.stdout
    env["DRESSAGE_REQUIRE_ALL"] = "1"
    failed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0, failed.stdout
    assert "DRESSAGE_REQUIRE_ALL=1: the made-up extra" in failed.stdout, failed.stdout
