"""``archive``: export + verify + drop, never dropping what was not verified."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dressage.exports.importer import import_run
from dressage.exports.verify import verify_export
from dressage.store import EventStore
from tests.cli.helpers import invoke
from tests.exports.conftest import RichRun


def test_archive_drops_only_after_verifying(
    cli: CliRunner, db_url: str, store: EventStore, rich_run: RichRun, tmp_path: Path
) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    refused = invoke(cli, db_url, "archive", rich_run.run, "--to", str(tmp_path / "busy"))
    assert refused.exit_code == 1 and "not empty" in refused.stderr
    assert store.runs.get(rich_run.run).name == rich_run.run  # still there

    summary = store.runs.summary(rich_run.run)
    result = invoke(cli, db_url, "archive", rich_run.run, "--to", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    assert "verified" in result.stdout
    assert rich_run.run not in [r.name for r in store.runs.list()]
    manifest = verify_export(tmp_path / "a")
    assert manifest["counts"]["turns"] == summary.turns

    back = import_run(store, tmp_path / "a")  # the same log, after the drop
    assert store.runs.summary(back).last_position == summary.last_position
