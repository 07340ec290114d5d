"""``export --where``: a read-only SQL predicate over ``trajectories`` chooses the sessions."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dressage.errors import InvalidRecordError
from dressage.exports.verify import verify_export
from dressage.exports.where import check_predicate, select_sessions
from dressage.store import EventStore
from tests.cli.helpers import invoke
from tests.exports.conftest import RichRun, build_rich_run
from tests.pg_roles import reader_url, writer_url
from tests.stores import open_store


def test_where_exports_the_good_trajectories(
    cli: CliRunner, db_url: str, store: EventStore, rich_run: RichRun, tmp_path: Path
) -> None:
    build_rich_run(store, rich_run.run + "-other")  # its sessions must never leak in
    out = tmp_path / "good"
    where = "reward >= 1 AND kind = 'train' AND run_name <> 'nothing'"
    result = invoke(cli, reader_url(db_url), "export", rich_run.run, "--to", str(out), "--where", where)
    assert result.exit_code == 0, result.output
    manifest = verify_export(out)
    assert manifest["complete"] is False and manifest["where"] == where
    assert not (out / "events.parquet").exists()
    sessions = pq.read_table(out / "sessions.parquet").to_pylist()
    assert [s["session_id"] for s in sessions] == [f"{rich_run.run}-train-t0-s0"]
    turns = pq.read_table(out / "turns.parquet", columns=["session_id"]).to_pylist()
    assert {t["session_id"] for t in turns} == {f"{rich_run.run}-train-t0-s0"}
    assert len(turns) == len(rich_run.turns[f"{rich_run.run}-train-t0-s0"])
    samples = pq.read_table(out / "samples.parquet").to_pylist()
    assert len(samples) == 2  # the compaction's two segments
    assert {s["rollout_id"] for s in samples} == {0}  # numbered as in the whole run (group 0 * 2 + 0)


@pytest.mark.parametrize(
    ("predicate", "message"),
    [
        ("rewrd >= 1", "--where 'rewrd >= 1' was refused: query failed:"),
        ("1=1) OR (1=1", "unmatched ')'"),
        ("1=1; DROP TABLE runs", "without ';'"),
        ("reward > 0 -- comment", "comments"),
        ("kind = 'train", "unterminated"),
        ("  ", "--where is empty"),
    ],
)
def test_bad_where_is_one_line(
    cli: CliRunner,
    db_url: str,
    store: EventStore,
    rich_run: RichRun,
    tmp_path: Path,
    predicate: str,
    message: str,
) -> None:
    url = reader_url(db_url)
    result = invoke(cli, url, "export", rich_run.run, "--to", str(tmp_path / "x"), "--where", predicate)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert store.runs.get(rich_run.run).name == rich_run.run


def test_where_cannot_write(db_url: str, store: EventStore, rich_run: RichRun, tmp_path: Path) -> None:
    """A predicate that tries to write, as a login that may write every table: the database
    refuses it (a read-only transaction; a file opened read-only), nothing changed."""
    if store.db.dialect == "postgresql":
        predicate, refusal = "(SELECT nextval('runs_id_seq')) > 0", "read-only transaction"
    else:
        predicate, refusal = "(SELECT load_extension('x')) IS NULL", "not authorized"
    with open_store(writer_url(db_url), tmp_path / "home") as writer:
        with pytest.raises(InvalidRecordError, match=f"was refused: query failed: .*{refusal}"):
            select_sessions(writer.db, rich_run.run, predicate)
    assert len(store.sessions.list(rich_run.run)) == 6


def test_where_refuses_a_superuser_login(pg_url: str, tmp_path: Path) -> None:
    """A superuser is not bound by a read-only transaction: its --where is refused before it runs."""
    with open_store(pg_url, tmp_path / "home") as admin:
        with pytest.raises(InvalidRecordError, match=r"is a superuser.*db create-reader"):
            select_sessions(admin.db, "any", "reward >= 1")


def test_check_predicate_keeps_quoted_specials() -> None:
    assert check_predicate(" status = 'a;b(' ") == "status = 'a;b('"
