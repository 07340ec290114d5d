"""A wheel built from the repository is self-contained: installed into a fresh virtual environment
outside the checkout, ``dressage-worker db upgrade`` migrates a new SQLite and PostgreSQL database.

The wheel is built with the running interpreter's setuptools (``--no-build-isolation``, offline) from
a copy of the tree (the checkout gets no ``build/``). The fresh venv has no pip and no dependencies of
its own: a ``.pth`` file appends the running environment's site-packages, so the dependencies are the
ones already installed while ``dressage`` itself can only come from the wheel (checked).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from dressage.store.db import head_revision
from tests.conftest import PG_ADMIN_URL, pg_unavailable

REPO = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".dressage",
    "node_modules",
)
SHIPPED_TREES = {
    "dressage/": "dressage/",
    "workers/": "workers/",
    "recipes/": "recipes/",
    "migrations/": "dressage/store/migrations/",
}
"""Source directory -> where its files must be in the wheel (setup.py maps ``migrations/``)."""


@dataclass(frozen=True)
class InstalledWheel:
    """A fresh venv with the wheel installed, and the environment to run its commands in."""

    wheel: Path
    venv: Path
    workdir: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``venv/bin/ARGS[0] ARGS[1:]`` outside the checkout; fails the test on a non-zero exit."""
        proc = subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc


def _succeed(*cmd: str) -> str:
    """Run ``cmd``; its stdout, or a test failure showing its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _build_wheel(out: Path) -> Path:
    """``pip wheel`` of a copy of the tree, offline, with this environment's setuptools."""
    src = out / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    pip = (sys.executable, "-m", "pip")
    _succeed(
        *pip,
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(out / "dist"),
        str(src),
    )
    (wheel,) = (out / "dist").glob("dressage-*.whl")
    return wheel


def _fresh_venv(venv: Path, wheel: Path) -> None:
    """A venv without pip or packages, the wheel installed into it, this environment's packages after."""
    _succeed(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = str(venv / "bin" / "python")
    _succeed(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "-q",
        str(wheel),
    )
    site = _succeed(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    # Lines of a .pth file are appended to sys.path after the venv's own site-packages, and the
    # .pth files inside them are not processed: an editable install of the checkout stays inert.
    (Path(site) / "zz_test_dependencies.pth").write_text("\n".join(deps) + "\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """Build the wheel once, install it into a fresh venv, run from a directory outside the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(root)
    venv = root / "venv"
    _fresh_venv(venv, wheel)
    workdir = root / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DRESSAGE_"))}
    env["DRESSAGE_HOME"] = str(workdir / "home")
    return InstalledWheel(wheel=wheel, venv=venv, workdir=workdir, env=env)


def _source_files() -> list[str]:
    """Files under the shipped trees that git knows of (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *SHIPPED_TREES],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [path for path in listed if (REPO / path).is_file()]


def test_the_wheel_carries_every_file_the_package_reads(installed: InstalledWheel) -> None:
    """Modules, templates, typing marker and the alembic scripts: every source file is in the wheel."""
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    expected = set()
    for path in _source_files():
        source_root = next(root for root in SHIPPED_TREES if path.startswith(root))
        expected.add(SHIPPED_TREES[source_root] + path.removeprefix(source_root))
    assert "dressage/store/migrations/env.py" in expected
    assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"


def test_the_installed_package_runs_from_the_venv_not_the_checkout(installed: InstalledWheel) -> None:
    """``dressage`` and its migrations resolve inside the venv, and the CLI starts."""
    where = installed.run(
        "python",
        "-c",
        "import dressage; from dressage.store.db import migrations_dir; "
        "print(dressage.__file__); print(migrations_dir())",
    ).stdout.split()
    assert len(where) == 2
    for path in where:
        assert Path(path).is_relative_to(installed.venv), f"{path} is not from the installed wheel"
    assert "db" in installed.run("dressage-worker", "--help").stdout


def _alembic_version(url: str) -> str:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        assert row is not None
        return str(row[0])


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty database (no schema) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"dressage_wheel_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:  # the postgres tier skips without its server
        pg_unavailable(str(e).strip().splitlines()[0])
    try:
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_db_upgrade_from_the_wheel_migrates_a_fresh_database(
    installed: InstalledWheel, empty_database: str
) -> None:
    """``dressage-worker db upgrade`` from the installed wheel brings a new database to head."""
    out = installed.run("dressage-worker", "db", "upgrade", "--database-url", empty_database).stdout
    assert "schema upgraded" in out
    assert _alembic_version(empty_database) == head_revision()
