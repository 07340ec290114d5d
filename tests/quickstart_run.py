"""The README's quickstart command, parsed from README.md and run as printed, once per test session.

Two default-tier tests read the same run: ``tests/test_readme_newcomer.py`` (the command and its
follow-ups, as a newcomer types them) and ``tests/rollout/test_quickstart.py`` (what the log holds,
how long it took, its SFT export). Each run of it is 60 sandboxed sessions and a dev engine's start,
so the session-scoped ``readme_quickstart`` fixture (tests/conftest.py) runs it once per test run:
under xdist the first worker to need it runs it, the others wait on a file lock and read its result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
WORKER = ".venv/bin/dressage-worker"


def quickstart_commands(readme: str) -> tuple[str, list[str]]:
    """(the quickstart command without its set-up step, the first three follow-up commands)."""
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split("  #", 1)[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
        for line in block.splitlines()
    ]
    commands = [line for line in lines if WORKER in line]
    first = commands[0].split("&&")[-1].strip()
    assert first.startswith(f"{WORKER} rollout"), first
    return first, commands[1:4]


def newcomer_env() -> dict[str, str]:
    """The environment of a newcomer's shell: no ``DRESSAGE_`` settings; this checkout's code on
    ``PYTHONPATH``, whichever checkout the venv was installed from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@dataclass
class QuickstartRun:
    """The quickstart as run in ``folder`` (which holds only ``.venv``, a link to this venv, and a
    copy of ``examples/``; the run's log lands in ``folder/.dressage``)."""

    folder: Path
    command: str
    done: subprocess.CompletedProcess[str]
    elapsed_s: float


def run_in(folder: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run by bash in ``folder`` as a newcomer's shell would (exit status not checked)."""
    return subprocess.run(
        ["bash", "-c", command], cwd=folder, env=newcomer_env(), capture_output=True, text=True, timeout=600
    )


def run_readme_quickstart(folder: Path) -> QuickstartRun:
    """Lay out ``folder`` and run the README's quickstart command in it, as printed."""
    first, _ = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    (folder / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "examples", folder / "examples")
    t0 = time.monotonic()
    done = run_in(folder, first)
    return QuickstartRun(folder, first, done, time.monotonic() - t0)


def shared_readme_quickstart(root: Path) -> QuickstartRun:
    """The quickstart run in ``root/readme-quickstart``, once for every process sharing ``root``
    (xdist workers of one run): the first runs it and records the result in
    ``root/readme-quickstart.json``; the others, waiting on the lock, read it."""
    folder, record = root / "readme-quickstart", root / "readme-quickstart.json"
    with FileLock(str(record) + ".lock"):
        if record.is_file():
            kept = json.loads(record.read_text(encoding="utf-8"))
            done = subprocess.CompletedProcess(
                kept["command"], kept["returncode"], kept["stdout"], kept["stderr"]
            )
            return QuickstartRun(folder, kept["command"], done, kept["elapsed_s"])
        folder.mkdir()
        run = run_readme_quickstart(folder)
        kept = {"command": run.command, "elapsed_s": run.elapsed_s, "returncode": run.done.returncode}
        record.write_text(json.dumps({**kept, "stdout": run.done.stdout, "stderr": run.done.stderr}))
        return run
