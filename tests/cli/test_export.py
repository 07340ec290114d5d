"""``export`` writes a self-contained Parquet archive whose hashes verify and whose arrays are exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner

from dressage.exports.arrow import cube_from_column
from dressage.exports.verify import verify_export
from dressage.store import EventStore
from dressage.store.db import head_revision
from tests.cli.conftest import Populated
from tests.cli.helpers import assert_tampering_caught, invoke


def test_export_verifies_and_round_trips(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    result = invoke(cli, db_url, "export", populated.run, "--to", str(out))
    assert result.exit_code == 0, result.output
    manifest = verify_export(out)
    assert manifest["run"] == populated.run
    assert manifest["config"] == {"model": "tiny", "seed": 7}
    assert manifest["schema_revision"] == head_revision()
    counts = manifest["counts"]
    assert (counts["sessions"], counts["turns"], counts["tokens"], counts["trained_tokens"]) == (4, 6, 22, 8)
    assert (counts["policy_versions"], counts["artifacts"]) == (2, 1)
    assert counts["events"] == manifest["last_position"] == store.events.last_position(populated.run)
    assert (out / "tasks.parquet").exists() and (out / "train_steps.parquet").exists()

    events = pq.read_table(out / "events.parquet").to_pylist()
    assert [e["position"] for e in events] == list(range(1, len(events) + 1))
    sha = pq.read_table(out / "artifacts.parquet").to_pylist()[0]["sha256"]
    assert (out / "artifacts" / sha).read_bytes() == populated.artifact

    exported = {
        (t["session_id"], t["turn_index"]): t for t in pq.read_table(out / "turns.parquet").to_pylist()
    }
    assert len(exported) == len(populated.turns)
    for rec in populated.turns:
        got = exported[(rec.session_id, rec.turn_index)]
        got["routed_experts"] = cube_from_column(
            got["routed_experts"], got["routed_experts_shape"], got["routed_experts_dtype"]
        )
        np.testing.assert_array_equal(got["context_ids"], np.asarray(rec.context_ids, dtype=np.int32))
        np.testing.assert_array_equal(got["generated_ids"], np.asarray(rec.generated_ids, dtype=np.int32))
        np.testing.assert_array_equal(got["logprobs"], np.asarray(rec.logprobs, dtype=np.float32))
        np.testing.assert_array_equal(got["policy_versions"], np.asarray(rec.policy_versions, dtype=np.int32))
        mask = np.ones(len(rec.generated_ids), bool) if rec.loss_mask is None else np.asarray(rec.loss_mask)
        np.testing.assert_array_equal(got["loss_mask"], mask)
        assert got["boundary_reason"] == rec.boundary_reason and got["segment_index"] == rec.segment_index
        if rec.routed_experts is None:
            assert got["routed_experts"] is None
        else:
            assert got["routed_experts"].dtype == rec.routed_experts.dtype
            np.testing.assert_array_equal(got["routed_experts"], rec.routed_experts)

    def tamper(out: Path) -> None:
        with (out / "turns.parquet").open("ab") as f:
            f.write(b"\n")

    assert_tampering_caught(
        cli,
        db_url,
        populated.run,
        out,
        tamper,
        match=r"altered turns\.parquet",
        message="altered turns.parquet",
    )
