"""A rollout in which no session finished exits non-zero with the agent's last line (issue 26, point 4).

It used to exit 0 with a summary, each failure ending in an empty colon
(``agent command exited with code 3: ``) when the agent printed nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dressage.cli import app
from tests.rollout.conftest import write_config, write_tasks
from tests.rollout.test_rollout_e2e import LETTERS


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("echo starting >&2; echo 'no API key: set FOO' >&2; exit 3", "the last error: no API key: set FOO"),
        ("exit 3", "exited with code 3: it printed nothing on stderr or stdout"),
    ],
)
def test_a_rollout_where_every_session_failed_exits_1_with_the_last_line(
    tmp_path: Path, engine_url: str, monkeypatch: pytest.MonkeyPatch, script: str, expected: str
) -> None:
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")  # no terminal, 80 columns: the hints still print whole (point 9)
    write_tasks(tmp_path / "tasks.jsonl", LETTERS[:1])
    cfg = write_config(
        tmp_path,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "command", "command": ["sh", "-c", script]},
        worker={"max_attempts": 1},
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    result = CliRunner().invoke(app, ["rollout", "--config", str(cfg), "--no-progress", "--database-url", db])
    assert result.exit_code == 1, result.output
    err = " ".join(result.stderr.split())
    assert "error: no session of run" in err and "finished (1 failed)" in err
    assert expected in err
    hint = [line for line in result.stderr.splitlines() if "dressage-worker sql --database-url" in line]
    assert len(hint) == 1 and hint[0].endswith('group by status"'), result.stderr
