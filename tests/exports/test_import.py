"""``import``: export -> import -> export gives identical file hashes; the imported run trains and
replays with the original's step hashes; bad imports are refused with one line."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from dressage.errors import ReplayDriftError
from dressage.exports.export import export_run
from dressage.exports.importer import import_run
from dressage.store import EventStore, schema
from dressage.store.read_only_sql import run_read_only
from dressage.training import StepOptions, Trainer
from dressage.training.consumer import NullBackend
from dressage.training.torch_backend import TorchBackend
from tests.cli.helpers import invoke
from tests.exports.conftest import RichRun
from tests.pg_roles import reader_url
from tests.stores import open_store
from tests.view.builders import build_fork_tree


def _hashes(manifest: dict) -> dict[str, str]:
    return {name: f["sha256"] for name, f in manifest["files"].items()}


def _decisions(by_step: dict) -> list[tuple]:
    return [
        (
            step,
            d.sample,
            d.session_id,
            d.segment_index,
            d.response_start,
            d.advantage,
            d.mask_reasons.tolist(),
            None if d.importance_weights is None else d.importance_weights.tolist(),
        )
        for step, ds in sorted(by_step.items())
        for d in ds
    ]


def _tamper_advantage(store: EventStore, run: str) -> None:
    d = schema.train_token_decisions.c
    with store.db.write() as conn:
        conn.execute(
            update(schema.train_token_decisions)
            .where(d.run_id == store.runs.get(run).id, d.consumer == "train:main", d.sample == 0)
            .values(advantage=7.0)
        )


def test_round_trip_has_identical_hashes_and_replays(
    cli: CliRunner, store: EventStore, rich_run: RichRun, other_url: str, other: EventStore, tmp_path: Path
) -> None:
    options = StepOptions(2, 2)
    steps = Trainer(store, rich_run.run, options, NullBackend()).run_steps()
    assert len(steps) == 1  # task 1 has a failed member: its group is dropped
    torch_backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3", seed=1)
    assert len(Trainer(store, rich_run.run, options, torch_backend, consumer="torch").run_steps()) == 1
    first = export_run(store, rich_run.run, tmp_path / "a")
    assert first["counts"]["step_metrics"] > 0 and first["counts"]["token_decisions"] == 2 * len(
        steps[0].batch.samples
    )

    new_name = rich_run.run + "-imported"
    result = invoke(cli, other_url, "import", str(tmp_path / "a"), "--as", new_name)
    assert result.exit_code == 0, result.output
    assert "6 sessions" in result.stdout
    second = export_run(other, new_name, tmp_path / "b")
    assert _hashes(second) == _hashes(first)
    assert second["counts"] == first["counts"] and second["last_position"] == first["last_position"]

    for consumer in ("train:main", "train:torch"):  # the step metrics and decisions came along
        assert other.consumers.metrics(new_name, consumer) == store.consumers.metrics(rich_run.run, consumer)
        mine, theirs = (
            s.consumers.decisions(r, consumer) for s, r in ((store, rich_run.run), (other, new_name))
        )
        assert _decisions(theirs) == _decisions(mine)
    assert all(
        d.importance_weights is not None for d in other.consumers.decisions(new_name, "train:torch")[1]
    )
    replayed = Trainer(other, new_name, options, NullBackend()).replay()  # compares them too
    assert [b.batch_hash for b in replayed] == [s.batch.batch_hash for s in steps]
    _tamper_advantage(other, new_name)
    with pytest.raises(ReplayDriftError, match=r"advantage was recorded as 7\.0"):
        Trainer(other, new_name, options, NullBackend()).replay()
    again = Trainer(other, new_name, options, NullBackend(), consumer="again").run_steps()
    assert [s.batch.batch_hash for s in again] == [s.batch.batch_hash for s in steps]
    query = (
        f"SELECT kind, COUNT(*) FROM trajectories WHERE run_name = '{new_name}' GROUP BY kind ORDER BY kind"
    )
    with open_store(reader_url(other_url), tmp_path / "home2") as reader:
        assert run_read_only(reader.db, query, limit=10)[1] == [("eval", 2), ("train", 4)]
    ref = other.artifacts.list(new_name)[0]
    assert other.artifacts.get(ref) == rich_run.artifact


def test_import_refusals(
    cli: CliRunner, db_url: str, store: EventStore, rich_run: RichRun, other_url: str, tmp_path: Path
) -> None:
    export_run(store, rich_run.run, tmp_path / "a")
    same_db = invoke(cli, db_url, "import", str(tmp_path / "a"), "--as", rich_run.run + "-copy")
    assert same_db.exit_code == 1 and "already exists in this log" in same_db.stderr
    existing = invoke(cli, db_url, "import", str(tmp_path / "a"))
    assert existing.exit_code == 1 and "choose another name with --as" in existing.stderr

    with open_store(reader_url(db_url), tmp_path / "home") as reader:  # --where runs as a reader
        export_run(reader, rich_run.run, tmp_path / "w", where="reward >= 1")
    partial = invoke(cli, other_url, "import", str(tmp_path / "w"))
    assert partial.exit_code == 3 and "--where export" in partial.stderr

    (tmp_path / "a" / "events.parquet").write_bytes(b"x")
    altered = invoke(cli, other_url, "import", str(tmp_path / "a"))
    assert altered.exit_code == 3 and "altered events.parquet" in altered.stderr
    assert len(altered.stderr.strip().splitlines()) == 1


def test_import_api_keeps_the_name(
    store: EventStore, rich_run: RichRun, other: EventStore, tmp_path: Path
) -> None:
    export_run(store, rich_run.run, tmp_path / "a")
    run = import_run(other, tmp_path / "a")
    assert run.name == rich_run.run and run.config == {"model": "tiny", "seed": 3}
    assert other.runs.summary(run).turns == sum(len(v) for v in rich_run.turns.values())


def test_forks_survive_export_and_import(
    store: EventStore, run_name: str, other_url: str, other: EventStore, tmp_path: Path
) -> None:
    tree = build_fork_tree(store, run_name)
    first = export_run(store, run_name, tmp_path / "a")
    sessions = pq.read_table(tmp_path / "a" / "sessions.parquet").to_pylist()
    forks = {s["session_id"]: (s["parent_session_id"], s["fork_turn"]) for s in sessions}
    assert forks == {
        tree.root: (None, None), tree.a: (tree.root, 2), tree.b: (tree.root, 2), tree.aa: (tree.a, 3),
    }  # fmt: skip
    import_run(other, tmp_path / "a", as_run=run_name + "-imported")
    assert [(s.id, s.parent_session_id, s.fork_turn) for s in other.sessions.tree(tree.b)] == [
        (tree.root, None, None), (tree.a, tree.root, 2), (tree.aa, tree.a, 3), (tree.b, tree.root, 2),
    ]  # fmt: skip
    second = export_run(other, run_name + "-imported", tmp_path / "b")
    assert _hashes(second) == _hashes(first)
