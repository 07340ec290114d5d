"""``--help`` without a terminal (a pipe, CI) is wide enough for every option name (issue 34: at
rich's default of 80 columns, ``--global-batch-size`` read ``--global-batch-si…``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from dressage.cli import app


def _option_names(command: str) -> list[str]:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return [name for p in cmd.params for name in p.opts if name.startswith("--")]


@pytest.mark.parametrize("command", ["train", "loop", "rollout"])
def test_help_through_a_pipe_shows_whole_option_names(command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    out = subprocess.run(
        [sys.executable, "-c", "from dressage.cli import main; main()", command, "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    names = _option_names(command)
    assert "--global-batch-size" in names or command != "train"
    words = set(out.replace("│", " ").split())
    missing = [n for n in names if n not in words]
    assert not missing, out
    assert "…" not in out, out
