"""``train --from-export DIR``: the export is verified, imported once under a derived name, and
trains (and replays) with the original run's step hashes; an altered directory is refused."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dressage.exports.export import export_run
from dressage.exports.source import export_run_name
from dressage.store import EventStore
from dressage.training import StepOptions, Trainer
from dressage.training.consumer import NullBackend, consumer_name
from tests.cli.helpers import invoke
from tests.exports.conftest import RichRun


def test_train_from_an_export_directory(
    cli: CliRunner,
    store: EventStore,
    rich_run: RichRun,
    other_url: str,
    other: EventStore,
    tmp_path: Path,
) -> None:
    steps = Trainer(store, rich_run.run, StepOptions(2, 2), NullBackend()).run_steps()
    export_run(store, rich_run.run, tmp_path / "a")
    name = export_run_name(tmp_path / "a")
    assert name.startswith(f"{rich_run.run}@export-")
    args = ["train", "--from-export", str(tmp_path / "a"), "--backend", "none", "--out", str(tmp_path / "o")]
    args += ["--global-batch-size", "2", "--n-samples-per-prompt", "2"]
    first = invoke(cli, other_url, *args)
    assert first.exit_code == 0, first.output
    assert f"is run {name!r} in this log" in first.stderr
    recorded = other.consumers.steps(name, consumer_name("main"))
    assert [s.batch_hash for s in recorded] == [s.batch.batch_hash for s in steps]

    again = invoke(cli, other_url, *args)  # the run is there: not imported twice
    assert again.exit_code == 0, again.output
    assert [r.name for r in other.runs.list()].count(name) == 1
    replay = invoke(cli, other_url, *args, "--replay")
    assert replay.exit_code == 0 and "hash matches" in replay.output + replay.stderr

    (tmp_path / "a" / "turns.parquet").write_bytes(b"x")
    altered = invoke(cli, other_url, *args)
    assert altered.exit_code != 0 and "altered turns.parquet" in altered.stderr


def test_train_needs_a_source(cli: CliRunner, db_url: str) -> None:
    result = invoke(cli, db_url, "train", "--backend", "none")
    assert result.exit_code != 0 and "--from-run RUN or a --from-export DIR" in result.stderr


def test_a_missing_export_is_one_line(cli: CliRunner, db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["train", "--from-export", str(tmp_path / "nowhere"), "--backend", "none", "--out", str(out)]
    result = invoke(cli, db_url, *args)
    assert result.exit_code != 0 and "no readable manifest.json" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_from_export_creates_a_new_sqlite_file(
    cli: CliRunner, store: EventStore, rich_run: RichRun, tmp_path: Path
) -> None:
    """Importing an export writes the log, so a SQLite file that does not exist yet is created (as
    rollout and import do), not refused as a reader's mistyped path would be."""
    export_run(store, rich_run.run, tmp_path / "a")
    new = tmp_path / "fresh" / "new.db"
    args = ["train", "--from-export", str(tmp_path / "a"), "--backend", "none", "--out", str(tmp_path / "o")]
    result = invoke(cli, f"sqlite:///{new}", *args, "--global-batch-size", "2", "--n-samples-per-prompt", "2")
    assert result.exit_code == 0, result.output
    assert new.is_file()
    fresh = EventStore.open(f"sqlite:///{new}")
    try:
        assert [r.name for r in fresh.runs.list()] == [export_run_name(tmp_path / "a")]
        assert fresh.consumers.steps(export_run_name(tmp_path / "a"), consumer_name("main"))
    finally:
        fresh.close()
