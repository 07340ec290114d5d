"""``export --format parquet``: files that pyarrow, DuckDB and ``datasets`` read with no code of
ours (polars too), holding every token id, logprob, mask, version and routed expert exactly as
the log does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
from typer.testing import CliRunner

from dressage.exports.arrow import cube_from_column
from dressage.exports.export import export_run
from dressage.exports.verify import verify_export
from dressage.store import EventStore
from dressage.store.db import head_revision
from dressage.training.materialize import Trajectory, materialize_trajectory
from tests.cli.helpers import assert_tampering_caught, invoke
from tests.exports.conftest import RichRun


def _check_turn(got: dict[str, Any], rec: Any) -> None:
    """One exported turn row against the record that was appended."""
    assert got["context_ids"] == [int(x) for x in rec.context_ids]
    assert got["generated_ids"] == [int(x) for x in rec.generated_ids]
    np.testing.assert_array_equal(
        np.asarray(got["logprobs"], np.float32), np.asarray(rec.logprobs, np.float32)
    )
    assert got["policy_versions"] == [int(x) for x in rec.policy_versions]
    mask = [True] * len(rec.generated_ids) if rec.loss_mask is None else [bool(x) for x in rec.loss_mask]
    assert got["loss_mask"] == mask
    assert (got["segment_index"], got["segment_offset"], got["thread_index"]) == (
        rec.segment_index,
        rec.segment_offset,
        rec.thread_index,
    )
    assert got["finish_reason"] == rec.finish_reason
    assert json.loads(got["sampling_params"]) == rec.sampling_params
    assert json.loads(got["info"]) == rec.info
    experts = cube_from_column(
        got["routed_experts"], got["routed_experts_shape"], got["routed_experts_dtype"]
    )
    if rec.routed_experts is None:
        assert experts is None
    else:
        assert experts is not None and experts.dtype == rec.routed_experts.dtype
        np.testing.assert_array_equal(experts, rec.routed_experts)


def test_parquet_export_reads_back_exactly(
    cli: CliRunner, db_url: str, store: EventStore, rich_run: RichRun, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    result = invoke(cli, db_url, "export", rich_run.run, "--to", str(out), "--format", "parquet")
    assert result.exit_code == 0, result.output
    manifest = verify_export(out)
    assert manifest["run"] == rich_run.run and manifest["complete"] is True
    assert manifest["schema_revision"] == head_revision()
    n_turns = sum(len(v) for v in rich_run.turns.values())
    assert manifest["counts"]["turns"] == n_turns and manifest["counts"]["sessions"] == 6

    # pyarrow
    turns = pq.read_table(out / "turns.parquet").to_pylist()
    assert len(turns) == n_turns
    by_key = {(t["session_id"], t["turn_index"]): t for t in turns}
    for sid, records in rich_run.turns.items():
        for rec in records:
            got = by_key[(sid, rec.turn_index)]
            assert got["kind"] == rich_run.kind[sid]
            _check_turn(got, rec)
    # ... and the log as the trainer reads it
    for turn in store.turns.read(rich_run.run):
        got = by_key[(turn.session_id, turn.turn_index)]
        assert got["turn_id"] == turn.id and got["content_hash"] == turn.content_hash
        assert got["position"] == turn.position

    # DuckDB, straight from the file
    con = duckdb.connect()
    tokens = con.execute(
        f"SELECT session_id, turn_index, unnest(generated_ids) AS tok, unnest(logprobs) AS lp, "
        f"unnest(loss_mask) AS m, unnest(policy_versions) AS v FROM '{out / 'turns.parquet'}'"
    ).fetchall()
    expected = [
        (
            sid,
            rec.turn_index,
            int(tok),
            float(np.float32(lp)),
            True if rec.loss_mask is None else bool(m),
            int(v),
        )
        for sid, records in rich_run.turns.items()
        for rec in records
        for tok, lp, m, v in zip(
            rec.generated_ids,
            rec.logprobs,
            rec.loss_mask or [True] * len(rec.generated_ids),
            rec.policy_versions,
            strict=True,
        )
    ]
    assert sorted(tokens) == sorted(expected)
    rewards = dict(
        con.execute(
            f"SELECT session_id, reward FROM '{out / 'sessions.parquet'}' WHERE status = 'finished'"
        ).fetchall()
    )
    assert set(rewards) == {s for s, st in rich_run.status.items() if st == "finished"}
    kinds = dict(con.execute(f"SELECT session_id, kind FROM '{out / 'sessions.parquet'}'").fetchall())
    assert kinds == rich_run.kind

    # polars
    frame = pl.read_parquet(out / "turns.parquet")
    assert frame.height == n_turns
    for row in frame.iter_rows(named=True):
        _check_turn(row, rich_run.turns[row["session_id"]][row["turn_index"]])

    # Hugging Face datasets
    import datasets  # here, not at the top: only this test's xdist worker pays the import

    ds = datasets.load_dataset(
        "parquet", data_files=str(out / "turns.parquet"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert len(ds) == n_turns
    for row in ds:
        sid = row["session_id"]
        _check_turn(row, rich_run.turns[sid][row["turn_index"]])

    _check_samples(store, rich_run, out, tmp_path)


def _check_samples(store: EventStore, rich_run: RichRun, out: Path, tmp_path: Path) -> None:
    """samples.parquet holds what the trainer materializes, segment by segment."""
    sessions = {s["session_id"]: s for s in pq.read_table(out / "sessions.parquet").to_pylist()}
    import datasets  # here, not at the top: only this test's xdist worker pays the import

    samples = datasets.load_dataset(
        "parquet", data_files=str(out / "samples.parquet"), split="train", cache_dir=str(tmp_path / "hf2")
    )
    got = {(s["session_id"], s["segment_index"]): s for s in samples}
    trained = [sid for sid, k in rich_run.kind.items() if k == "train" and rich_run.status[sid] == "finished"]
    expected_keys = set()
    for sid in trained:
        s = sessions[sid]
        rid = s["group_index"] * 2 + s["sample_index"]
        traj = Trajectory(sid, s["reward"], "completed", rid, s["group_index"], rid)
        for sample in materialize_trajectory(store.turns.read(session_id=sid), traj):
            row = got[(sid, sample.segment_index)]
            expected_keys.add((sid, sample.segment_index))
            assert row["tokens"] == sample.tokens.tolist()
            assert row["loss_mask"] == sample.loss_mask.tolist()
            np.testing.assert_array_equal(
                np.asarray(row["rollout_log_probs"], np.float32), sample.rollout_log_probs
            )
            assert row["policy_versions"] == sample.policy_versions.tolist()
            assert (row["response_length"], row["is_anchor"], row["rollout_id"]) == (
                sample.response_length,
                sample.is_anchor,
                sample.rollout_id,
            )
    assert set(got) == expected_keys
    assert any(not s["is_anchor"] for s in samples)  # the compaction's first segment


def test_verify_export_finds_altered_and_missing_files(
    cli: CliRunner, db_url: str, store: EventStore, rich_run: RichRun, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    manifest = export_run(store, rich_run.run, out)
    blobs = [name for name in manifest["files"] if name.startswith("artifacts/")]
    assert [(out / name).read_bytes() for name in blobs] == [rich_run.artifact]

    def tamper(out: Path) -> None:
        with (out / "sessions.parquet").open("ab") as f:
            f.write(b"\0")
        (out / "tasks.parquet").unlink()

    match = r"missing tasks\.parquet, altered sessions\.parquet"
    assert_tampering_caught(
        cli, db_url, rich_run.run, out, tamper, match=match, message="altered sessions.parquet"
    )


def test_export_streams_in_row_groups(store: EventStore, rich_run: RichRun, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    export_run(
        store, rich_run.run, tmp_path / "e", batch_sessions=2, progress=lambda d, n: seen.append((d, n))
    )
    assert seen == [(2, 6), (4, 6), (6, 6)]
    assert pq.ParquetFile(tmp_path / "e" / "turns.parquet").num_row_groups == 3
