"""``export --checkpoints`` (SQLite and PostgreSQL): the sandbox checkpoints of the exported
sessions (rows, changes, manifests and file blobs) travel in the export, verified by its manifest;
``import`` brings them back into another log's blob store, where a checkpoint restores the same
files and its diffs read the same; exporting the imported run gives the same file hashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dressage.errors import StoreError
from dressage.exports.export import export_run
from dressage.exports.importer import import_run
from dressage.exports.verify import verify_export
from dressage.paddock.checkpoints import Manifest, restore
from dressage.paddock.workspace_diffs import turn_diffs
from dressage.store import EventStore
from tests.cli.helpers import invoke
from tests.workspace_sessions import build_checkpointed_session


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_checkpoints_round_trip(
    db_url: str, store: EventStore, other: EventStore, run_name: str, tmp_path: Path
) -> None:
    built = build_checkpointed_session(store, run_name, tmp_path / "trees")
    cli = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "DRESSAGE_HOME": str(tmp_path / "home")})
    result = invoke(cli, db_url, "export", run_name, "--to", str(tmp_path / "exp"), "--checkpoints")
    assert result.exit_code == 0, result.output + result.stderr
    manifest = verify_export(tmp_path / "exp")
    n_changes = sum(len(store.sandbox_checkpoints.changes(c.session_id, c.turn_index))
                    for sid in (built.session_id, built.fork_id)
                    for c in store.sandbox_checkpoints.by_session(sid))  # fmt: skip
    assert manifest["counts"]["checkpoints"] == 5 and manifest["counts"]["checkpoint_changes"] == n_changes
    blobs = [f for f in manifest["files"] if f.startswith("checkpoints/")]
    assert len(blobs) == manifest["counts"]["checkpoint_blobs"] > 5

    imported = import_run(other, tmp_path / "exp", as_run=run_name)
    assert imported.name == run_name
    for sid in (built.session_id, built.fork_id):
        mine = store.sandbox_checkpoints.by_session(sid)
        theirs = other.sandbox_checkpoints.by_session(sid)
        assert [(c.turn_index, c.manifest_sha256, c.position) for c in theirs] == [
            (c.turn_index, c.manifest_sha256, c.position) for c in mine
        ]
        assert all(c.manifest_uri != d.manifest_uri for c, d in zip(mine, theirs, strict=True))
        for c, d in zip(mine, theirs, strict=True):  # the agent's request K travels too
            request = other.sandbox_checkpoints.read_request(d)
            assert request is not None and request == store.sandbox_checkpoints.read_request(c)
    assert turn_diffs(other, built.session_id, 1) == turn_diffs(store, built.session_id, 1)
    assert turn_diffs(other, built.fork_id, 3) == turn_diffs(store, built.fork_id, 3)
    assert other.artifacts.blobs is not None
    last = other.sandbox_checkpoints.get(built.session_id, 3)
    assert last is not None
    (tmp_path / "restored").mkdir()
    restore(
        Manifest.from_bytes(other.sandbox_checkpoints.read_manifest(last)),
        {"workspace": tmp_path / "restored"},
        other.artifacts.blobs,
    )
    assert _files(tmp_path / "restored") == _files(tmp_path / "trees" / "ws")

    again = export_run(other, run_name, tmp_path / "exp2", checkpoints=True)
    assert {k: v["sha256"] for k, v in again["files"].items()} == {
        k: v["sha256"] for k, v in manifest["files"].items()
    }


def test_without_the_option_and_refusals(store: EventStore, run_name: str, tmp_path: Path) -> None:
    build_checkpointed_session(store, run_name, tmp_path / "trees")
    plain = export_run(store, run_name, tmp_path / "plain")
    assert "checkpoints" not in plain["counts"]
    assert not [f for f in plain["files"] if f.startswith("checkpoint")]
    with pytest.raises(StoreError, match="--checkpoints needs --format parquet"):
        export_run(store, run_name, tmp_path / "sft", fmt="sft", checkpoints=True)
