"""``runs``, ``show``, ``sql``, ``drop`` and ``db current`` on both backends, through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dressage.cli import app
from dressage.store import EventStore
from dressage.store.db import head_revision
from tests.cli.conftest import Populated
from tests.cli.helpers import add_eval_session, invoke, sql_json
from tests.pg_roles import reader_url, writer_url


def test_runs_lists_counts(cli: CliRunner, db_url: str, populated: Populated) -> None:
    result = invoke(cli, db_url, "runs", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["run"]: r for r in json.loads(result.stdout)}
    mine = rows[populated.run]
    assert mine["sessions"] == {"finished": 2, "failed": 1, "running": 1}
    assert (mine["turns"], mine["tokens"], mine["trained_tokens"]) == (6, 22, 8)
    assert mine["mean_reward"] == 0.5
    assert rows[populated.other_run]["turns"] == 1

    table = invoke(cli, db_url, "runs")
    assert table.exit_code == 0, table.output
    line = next(x for x in table.stdout.splitlines() if f" {populated.run} " in x)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    assert cells[0] == populated.run
    assert cells[2:] == ["1", "2", "1", "0", "6", "22", "8", "0.5", str(mine["last_position"])]


def test_show_prints_turns_segments_and_tokens(cli: CliRunner, db_url: str, populated: Populated) -> None:
    sid = populated.sessions["s1"]
    result = invoke(cli, db_url, "show", sid, "--tokens")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert populated.run in out and "finished" in out and "artifact 1" in out
    assert "template_prefix_mismatch" in out
    assert "0-1" in out  # policy versions of turn 1
    assert "length" in out
    assert "<|im_start|>" in out  # decoded with the Qwen3.5 tokenizer

    ids = invoke(cli, db_url, "show", sid, "--tokens", "--ids", "--limit", "1")
    assert ids.exit_code == 0, ids.output
    assert "[248045]" in ids.stdout and "first 1 shown" in ids.stdout
    assert "[103]" not in ids.stdout  # turn 1 is past --limit


def test_show_unknown_session_is_one_red_line(cli: CliRunner, db_url: str) -> None:
    result = invoke(cli, db_url, "show", "no-such-session")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: no session 'no-such-session'")
    assert "Traceback" not in result.output


def test_sql_returns_rows(cli: CliRunner, db_url: str, populated: Populated) -> None:
    rows = sql_json(
        cli,
        db_url,
        f"SELECT session_id, n_tokens FROM trajectories WHERE run_name = '{populated.run}' ORDER BY session_id;",
    )
    assert [r["n_tokens"] for r in rows] == [15, 4, 2, 1]
    table = invoke(
        cli,
        reader_url(db_url),
        "sql",
        f"SELECT COUNT(*) AS n FROM turns WHERE session_id = '{populated.sessions['s1']}'",
    )
    assert table.exit_code == 0 and "│ 3 " in table.stdout


def test_sql_from_stdin_and_file(cli: CliRunner, db_url: str, populated: Populated, tmp_path: Path) -> None:
    query = f"-- a comment first\nSELECT COUNT(*) AS n FROM trajectories WHERE run_name = '{populated.run}'"
    result = cli.invoke(app, ["sql", "--json", "--database-url", reader_url(db_url)], input=query)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"n": 4}]
    (tmp_path / "q.sql").write_text(query + ";\n")
    result = invoke(cli, reader_url(db_url), "sql", "--json", "--file", str(tmp_path / "q.sql"))
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": 4}]
    limited = invoke(cli, reader_url(db_url), "sql", "--limit", "2", "SELECT id FROM turns")
    assert limited.exit_code == 0 and "stopped at --limit 2" in limited.stdout


def test_sql_refuses_writes_and_changes_nothing(cli: CliRunner, db_url: str, populated: Populated) -> None:
    """As a login that may write every table (on PostgreSQL): the database refuses (see also
    tests/cli/test_sql_read_only.py)."""
    login = writer_url(db_url)
    where = f"(SELECT id FROM runs WHERE name = '{populated.run}')"
    attempts = [
        f"DELETE FROM turns WHERE run_id = {where}",
        f"update sessions SET reward = 5 WHERE run_id = {where}",
        "DROP VIEW trajectories",
        f"/* sneaky */ SELECT 1; -- x\nDELETE FROM turns WHERE run_id = {where}",
    ]
    for query in attempts:
        result = invoke(cli, login, "sql", query)
        assert result.exit_code == 1, query
        assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    # A data-modifying CTE reads like a SELECT; the read-only transaction must stop it.
    cte = f"WITH gone AS (DELETE FROM turns WHERE run_id = {where} RETURNING id) SELECT COUNT(*) FROM gone"
    if "sqlite" in db_url:
        cte = f"WITH x AS (SELECT 1) DELETE FROM turns WHERE run_id = {where}"
    result = invoke(cli, login, "sql", cte)
    assert result.exit_code == 1 and result.stderr.startswith("error: ")
    rows = sql_json(cli, db_url, f"SELECT COUNT(*) AS n FROM turns WHERE run_id = {where}")
    assert rows == [{"n": 6}]
    bad = invoke(cli, login, "sql", "SELECT no_such_column FROM runs")
    assert bad.exit_code == 1 and bad.stderr.startswith("error: query failed")


def test_drop_removes_only_that_run(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore
) -> None:
    refused = invoke(cli, db_url, "drop", populated.run, input="n\n")
    assert refused.exit_code == 1 and "not dropped" in refused.stderr
    assert store.runs.summary(populated.run).turns == 6

    result = invoke(cli, db_url, "drop", populated.run, "--yes")
    assert result.exit_code == 0, result.output
    names = [r["run"] for r in json.loads(invoke(cli, db_url, "runs", "--json").stdout)]
    assert populated.run not in names and populated.other_run in names
    assert store.runs.summary(populated.other_run).turns == 1
    rows = sql_json(cli, db_url, f"SELECT COUNT(*) AS n FROM sessions WHERE id LIKE '{populated.run}-s%'")
    assert rows == [{"n": 0}]
    again = invoke(cli, db_url, "drop", populated.run, "--yes")
    assert again.exit_code == 1 and "no run named" in again.stderr


def test_db_current_shows_head(cli: CliRunner, db_url: str) -> None:
    result = invoke(cli, db_url, "db", "current")
    assert result.exit_code == 0, result.output
    head = head_revision()
    assert f"current: {head}" in result.stdout and f"head:    {head}" in result.stdout


def test_db_upgrade_downgrade_on_a_fresh_sqlite(cli: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert "current: none" in invoke(cli, url, "db", "current").stdout
    behind = invoke(cli, url, "runs")
    assert behind.exit_code == 1 and "dressage-worker db upgrade" in behind.stderr
    assert invoke(cli, url, "db", "upgrade").exit_code == 0
    assert "No runs" not in invoke(cli, url, "runs").stdout
    assert f"current: {head_revision()}" in invoke(cli, url, "db", "current").stdout
    assert invoke(cli, url, "db", "downgrade", "base").exit_code == 0
    assert "current: none" in invoke(cli, url, "db", "current").stdout


def test_console_script_error_exit(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("dressage-worker")
    url = f"sqlite:///{tmp_path / 'none.db'}"
    proc = subprocess.run(
        [str(exe), "show", "x", "--database-url", url], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "Traceback" not in proc.stderr


def test_show_says_why_it_falls_back_to_token_ids(
    cli: CliRunner, db_url: str, populated: Populated, tmp_path, monkeypatch
) -> None:
    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(not_a_folder))
    result = invoke(cli, db_url, "show", populated.sessions["s1"], "--tokens")
    assert result.exit_code == 0, result.output
    assert "[248045]" in result.stdout  # ids, not text
    assert "note: showing token ids, not text: the qwen3.5 tokenizer could not be loaded" in result.stderr


def test_runs_and_show_keep_eval_apart(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore
) -> None:
    """An eval session is counted and averaged on its own: the training mean stays 0.5."""
    sid = add_eval_session(store, populated.run, version=1, reward=0.25)
    result = invoke(cli, db_url, "runs", "--json")
    mine = next(r for r in json.loads(result.stdout) if r["run"] == populated.run)
    assert mine["mean_reward"] == 0.5
    assert (mine["eval_sessions"], mine["eval_mean_reward"]) == ({"finished": 1}, 0.25)
    # its turn recorded loss mask 1 for its generated token, but an eval session is never trained
    assert (mine["turns"], mine["tokens"], mine["trained_tokens"]) == (7, 25, 8)
    [row] = sql_json(
        cli, db_url, f"SELECT n_tokens, n_trained_tokens FROM trajectories WHERE session_id = '{sid}'"
    )
    assert (row["n_tokens"], row["n_trained_tokens"]) == (3, 0)
    table = invoke(cli, db_url, "runs")
    line = next(x for x in table.stdout.splitlines() if f" {populated.run} " in x)
    assert [c.strip() for c in line.split("│")[1:-1]][7:9] == ["25", "8"]  # tokens, trained
    evals = table.stdout.split("eval sessions (not trained)")[1]
    line = next(x for x in evals.splitlines() if f" {populated.run} " in x)
    assert [c.strip() for c in line.split("│")[1:-1]] == [populated.run, "0", "1", "0", "0", "0.25"]
    shown = invoke(cli, db_url, "show", sid)
    assert shown.exit_code == 0, shown.output
    assert "eval of policy version 1" in shown.stdout
    assert "kind  train" in invoke(cli, db_url, "show", populated.sessions["s1"]).stdout
