"""The README's first hour, run as printed (issue 26): the quickstart and its first three follow-ups.

The commands are parsed from README.md (the Quickstart section's ``.venv/bin/dressage-worker`` lines,
the set-up step excluded: this checkout's venv stands in for it) and run with bash, exactly as
printed, in a fresh folder that holds only ``.venv`` (a link to this venv) and a copy of
``examples/``. ``SESSION_ID`` is the one placeholder: it becomes the session the rollout's hint names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_readme_names_a_quickstart_and_three_follow_ups() -> None:
    first, follow_ups = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert first == f"{WORKER} rollout --config examples/quickstart.yaml"
    assert [c.split()[1] for c in follow_ups] == ["runs", "show", "sql"]


def test_the_readme_quickstart_runs_as_printed(tmp_path: Path) -> None:
    from tests.paddock.conftest import bwrap_unavailable_reason

    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the quickstart needs bubblewrap: {reason}")
    first, follow_ups = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)  # this checkout's code, whichever checkout the venv was installed from

    def run(command: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        return done

    rollout = run(first)
    session = re.search(r"dressage-worker show (\w+) --tokens", rollout.stderr)
    assert session is not None, rollout.stderr
    outputs = [run(command.replace("SESSION_ID", session.group(1))).stdout for command in follow_ups]
    assert "quickstart" in outputs[0]  # runs
    assert session.group(1) in outputs[1]  # show
    assert "10 row(s)" in outputs[2]  # sql
    assert (tmp_path / ".dressage" / "dressage.db").is_file()


def test_ci_runs_the_readmes_test_command() -> None:
    """``.ci/run``'s default-tier stage is the README's test command, character for character."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Run the tests: the default tier.*?```bash\n([^\n]+)\n```", readme, re.DOTALL)
    assert found is not None and found.group(1).startswith(".venv/bin/pytest "), "no test command"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert f'stage "tests: default tier" {found.group(1)}\n' in ci
