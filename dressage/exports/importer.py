"""``dressage-worker import DIR [--as NAME]``: a whole-run export back into a log.

The export is verified against its manifest first; then every row goes in, in one write
transaction, with its recorded positions, keys, content hashes and timestamps, so the imported run
reads, trains and replays like the original and exporting it again gives byte-identical files.
Each turn passes the same validation as a live append (:func:`~dressage.store.records.prepare_turn`)
and its recomputed content hash must equal the recorded one. Database-local values are new: run,
task and artifact ids, artifact URIs (the blobs go into this log's blob store); session token
hashes are not carried (an imported session cannot be taken over).

Session ids are unique across a log, so an export imports into a log that does not already hold
its sessions: another database, or the same one after ``drop``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from sqlalchemy import Connection, insert, select

from dressage.errors import ExportVerificationError, InvalidRecordError, StoreError
from dressage.exports.arrow import cube_from_column
from dressage.exports.checkpoints import insert_checkpoints, prepare_import
from dressage.exports.export import portable_task_refs
from dressage.exports.tables import OPTIONAL_ARCHIVE_FILES
from dressage.exports.verify import verify_export
from dressage.store import schema as t
from dressage.store.decisions import short_floats
from dressage.store.event_store import EventStore
from dressage.store.records import NewTurn, Run, check_text, prepare_turn
from dressage.store.turn_io import token_fields

BATCH_ROWS = 2000
"""Rows per insert batch (events, turns): one Parquet record batch at a time is in memory."""


def _rows(path: Path) -> Iterator[list[dict[str, Any]]]:
    """The rows of a Parquet file in batches of :data:`BATCH_ROWS`."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        yield batch.to_pylist()


def _all_rows(path: Path) -> list[dict[str, Any]]:
    return [row for batch in _rows(path) for row in batch]


def import_run(
    store: EventStore,
    export_dir: Path | str,
    *,
    as_run: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Run:
    """Load the export in ``export_dir`` as run ``as_run`` (default: its own name); return the run."""
    root = Path(export_dir)
    manifest = verify_export(root)
    if not manifest.get("complete"):
        raise ExportVerificationError(
            f"{root} is a --where export ({manifest.get('where')!r}): a dataset, not a whole run; "
            "export the run without --where to import it"
        )
    name = as_run or str(manifest["run"])
    check_text(name, what="run name", max_chars=200)
    if any(r.name == name for r in store.runs.list()):
        raise InvalidRecordError(f"run {name!r} already exists in this log; choose another name with --as")
    sessions = _all_rows(root / "sessions.parquet")
    _check_sessions_free(store, [s["session_id"] for s in sessions])
    blobs = _put_blobs(store, root)
    checkpoints, changes = prepare_import(store, root)
    n_turns = int(manifest["counts"]["turns"])
    with store.db.write() as conn:
        run_id = conn.execute(
            insert(t.runs)
            .values(
                name=name,
                config=manifest["config"],
                config_hash=manifest["config_hash"],
                created_at=manifest["run_created_at"],
            )
            .returning(t.runs.c.id)
        ).scalar_one()
        conn.execute(insert(t.run_counters).values(run_id=run_id, last_position=manifest["last_position"]))
        tasks = _all_rows(root / "tasks.parquet")
        numbers = _insert_tasks(conn, run_id, tasks)
        task_ids = {(x["kind"], x["task_index"], x["sample_index"]): numbers[x["task_number"]] for x in tasks}
        _insert_sessions(conn, run_id, sessions, task_ids)
        for batch in _rows(root / "events.parquet"):
            conn.execute(insert(t.events), [_event(run_id, e, numbers) for e in batch])
        done = 0
        for batch in _rows(root / "turns.parquet"):
            conn.execute(insert(t.turns), [_turn(name, run_id, row) for row in batch])
            done += len(batch)
            if progress is not None:
                progress(done, n_turns)
        _insert_small_tables(conn, run_id, root, blobs)
        insert_checkpoints(conn, run_id, checkpoints, changes)
    # read back, not from the repository's cache: a run of that name dropped by another process
    # may still be cached with its old id
    return next(r for r in store.runs.list() if r.name == name)


def _check_sessions_free(store: EventStore, session_ids: list[str]) -> None:
    for start in range(0, len(session_ids), 500):
        chunk = session_ids[start : start + 500]
        with store.db.read() as conn:
            taken = conn.execute(
                select(t.sessions.c.id, t.runs.c.name)
                .join(t.runs, t.runs.c.id == t.sessions.c.run_id)
                .where(t.sessions.c.id.in_(chunk))
                .limit(1)
            ).first()
        if taken is not None:
            raise InvalidRecordError(
                f"session {taken.id} of this export already exists in this log (run {taken.name!r}); "
                "session ids are unique per log: import into another database, or drop that run first"
            )


def _put_blobs(store: EventStore, root: Path) -> dict[str, str]:
    """Every artifact blob into this log's blob store, checked; sha256 -> this store's URI."""
    uris: dict[str, str] = {}
    folder = root / "artifacts"
    if not folder.is_dir():
        return uris
    if store.artifacts.blobs is None:
        raise StoreError("this store has no blob store configured; open it with EventStore.open()")
    for blob in sorted(folder.iterdir()):
        data = blob.read_bytes()
        if hashlib.sha256(data).hexdigest() != blob.name:
            raise ExportVerificationError(f"artifact {blob} does not hash to its name")
        _, uris[blob.name] = store.artifacts.blobs.put(data)
    return uris


def _insert_tasks(conn: Connection, run_id: int, rows: list[dict[str, Any]]) -> dict[int, int]:
    """Insert the task queue in its recorded order; return task number -> this log's task id."""
    ids: dict[int, int] = {}
    for row in sorted(rows, key=lambda x: int(x["task_number"])):
        values = {k: v for k, v in row.items() if k != "task_number"}
        values |= {"run_id": run_id, "payload": json.loads(row["payload"])}
        ids[int(row["task_number"])] = int(
            conn.execute(insert(t.tasks).values(**values).returning(t.tasks.c.id)).scalar_one()
        )
    return ids


def _insert_sessions(
    conn: Connection, run_id: int, rows: list[dict[str, Any]], task_ids: dict[tuple[Any, ...], int]
) -> None:
    columns = set(t.sessions.c.keys()) - {"id", "run_id", "task_id", "token_sha256", "info"}
    values = [
        {c: s.get(c) for c in columns}  # an export from before a column existed: NULL
        | {
            "id": s["session_id"],
            "run_id": run_id,
            "task_id": task_ids.get((s["kind"], s["task_index"], s["sample_index"])),
            "info": json.loads(s["info"]),
        }
        for s in rows
    ]
    if values:
        conn.execute(insert(t.sessions), values)


def _event(run_id: int, e: dict[str, Any], task_ids: dict[int, int]) -> dict[str, Any]:
    """The event row, its payload's task number mapped back to this log's task id."""
    return e | {"run_id": run_id, "payload": portable_task_refs(json.loads(e["payload"]), task_ids)}


def _turn(run_name: str, run_id: int, row: dict[str, Any]) -> dict[str, Any]:
    """The turn row to insert, re-validated and re-hashed like a live append."""
    rec = NewTurn(
        **token_fields(row),
        routed_experts=cube_from_column(
            row["routed_experts"], row["routed_experts_shape"], row["routed_experts_dtype"]
        ),
        sampling_params=json.loads(row["sampling_params"]),
        info=json.loads(row["info"]),
        key=row["turn_id"],
    )
    prep = prepare_turn(run_name, rec)
    if prep.content_hash != row["content_hash"]:
        raise ExportVerificationError(
            f"turn {row['turn_index']} of session {row['session_id']} does not hash to its recorded "
            f"content_hash {row['content_hash'][:12]} (got {prep.content_hash[:12]})"
        )
    return {
        **prep.row_with_lists(),
        "run_id": run_id,
        "position": row["position"],
        "created_at": row["created_at"],
    }


def _short(weights: list[float] | None) -> list[float] | None:
    """Importance weights as written live (shortest float32 decimals), so a re-export is identical."""
    return None if weights is None else short_floats(np.asarray(weights, dtype=np.float32))


def _insert_small_tables(conn: Connection, run_id: int, root: Path, blobs: dict[str, str]) -> None:
    """Policy versions, train steps (their metrics and token decisions), consumer checkpoints and
    artifact records."""
    json_columns = {"manifest", "state"}
    for name, table in (
        ("policy_versions", t.policy_versions),
        ("train_steps", t.train_steps),
        ("step_metrics", t.train_step_metrics),
        ("token_decisions", t.train_token_decisions),
        ("consumer_checkpoints", t.consumer_checkpoints),
    ):
        if name in OPTIONAL_ARCHIVE_FILES and not (root / f"{name}.parquet").exists():
            continue  # an export written before the file existed
        rows = [
            {c: json.loads(v) if c in json_columns else v for c, v in row.items()} | {"run_id": run_id}
            for row in _all_rows(root / f"{name}.parquet")
        ]
        if name == "token_decisions":
            rows = [r | {"importance_weights": _short(r["importance_weights"])} for r in rows]
        if rows:
            conn.execute(insert(table), rows)
    artifacts = [
        row | {"run_id": run_id, "uri": blobs[row["sha256"]]} for row in _all_rows(root / "artifacts.parquet")
    ]
    if artifacts:
        conn.execute(insert(t.artifacts), artifacts)
