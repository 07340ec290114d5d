"""The README's first hour, run as printed (issue 26): the quickstart and its first three follow-ups.

The commands are parsed from README.md (the Quickstart section's ``.venv/bin/dressage-worker`` lines,
the set-up step excluded: this checkout's venv stands in for it) and run with bash, exactly as
printed, in a fresh folder that holds only ``.venv`` (a link to this venv) and a copy of
``examples/``. ``SESSION_ID`` is the one placeholder: it becomes the session the rollout's hint names.
"""

from __future__ import annotations

import re

from tests.quickstart_run import REPO, WORKER, QuickstartRun, quickstart_commands, run_in


def test_the_readme_names_a_quickstart_and_three_follow_ups() -> None:
    first, follow_ups = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert first == f"{WORKER} rollout --config examples/quickstart.yaml"
    assert [c.split()[1] for c in follow_ups] == ["runs", "show", "sql"]


def test_the_readme_quickstart_runs_as_printed(readme_quickstart: QuickstartRun) -> None:
    """The quickstart (run once per session by the ``readme_quickstart`` fixture, as printed, in a
    folder of its own), then its three follow-ups in that folder."""
    _, follow_ups = quickstart_commands((REPO / "README.md").read_text(encoding="utf-8"))
    rollout = readme_quickstart.done
    assert rollout.returncode == 0, f"$ {readme_quickstart.command}\n{rollout.stdout}\n{rollout.stderr}"
    session = re.search(r"dressage-worker show (\w+) --tokens", rollout.stderr)
    assert session is not None, rollout.stderr
    outputs = []
    for command in follow_ups:
        command = command.replace("SESSION_ID", session.group(1))
        done = run_in(readme_quickstart.folder, command)
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "quickstart" in outputs[0]  # runs
    assert session.group(1) in outputs[1]  # show
    assert "10 row(s)" in outputs[2]  # sql
    assert (readme_quickstart.folder / ".dressage" / "dressage.db").is_file()


def test_ci_runs_the_readmes_test_command() -> None:
    """``.ci/run``'s default-tier stage is the README's test command, character for character."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Run the tests: the default tier.*?```bash\n([^\n]+)\n```", readme, re.DOTALL)
    assert found is not None and found.group(1).startswith(".venv/bin/pytest "), "no test command"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert f'stage "tests: default tier" {found.group(1)}\n' in ci
