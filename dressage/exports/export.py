"""``dressage-worker export RUN --to DIR``: a run as Parquet files plus a hashed manifest.

Layout of an export directory (schemas in :mod:`dressage.exports.tables`, ``docs/export.md``)::

    manifest.json             format, run, config, counts, where, sha256 + size of every file
    turns.parquet  sessions.parquet  samples.parquet                  (the dataset)
    events.parquet  tasks.parquet  policy_versions.parquet  train_steps.parquet
    consumer_checkpoints.parquet  artifacts.parquet  artifacts/<sha256>  (a whole run only)
    checkpoints.parquet  checkpoint_changes.parquet  checkpoints/<sha256>  (with ``--checkpoints``)

Sessions are read in batches of ``batch_sessions``; each batch becomes one row group of each
dataset file, so memory is bounded by a batch, not by the run. The manifest is written last: a
directory without one is an interrupted export. Export a run that no worker is writing to (its
sessions finalized): the files are read in several transactions.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dressage.errors import StoreError, TrainingError
from dressage.exports import tables as tb
from dressage.exports.arrow import cube_column, list_column
from dressage.exports.checkpoints import write_checkpoints
from dressage.exports.rows import as_turn, session_rows, table_rows, turn_rows
from dressage.exports.sft import SFT_FILE, SftRows, sft_profile, sft_table
from dressage.exports.where import select_sessions
from dressage.store import schema as t
from dressage.store.event_store import EventStore
from dressage.store.records import Run
from dressage.training.materialize import Trajectory, materialize_trajectory
from dressage.training.samples import TrainSample
from dressage.training.steps import rollout_id_of

MANIFEST = "manifest.json"
EXPORT_FORMATS = ("parquet", "sft")
BATCH_SESSIONS = 64
"""Sessions per row group: a batch's turns are in memory at once, nothing more."""

Progress = Callable[[int, int], None]
"""Called with (sessions written, sessions to write) after each batch."""


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _writer(stack: ExitStack, out: Path, name: str, schema: pa.Schema) -> pq.ParquetWriter:
    return stack.enter_context(pq.ParquetWriter(out / f"{name}.parquet", schema, compression="zstd"))


def export_run(
    store: EventStore,
    run: str,
    out_dir: Path | str,
    *,
    where: str | None = None,
    fmt: str = "parquet",
    batch_sessions: int = BATCH_SESSIONS,
    progress: Progress | None = None,
    checkpoints: bool = False,
) -> dict[str, Any]:
    """Write run ``run`` to ``out_dir`` (absent or empty) and return the manifest.

    ``fmt`` ``sft`` writes only ``sft.parquet`` (:mod:`dressage.exports.sft`), never the archive.

    With ``where`` (a SQL predicate over the ``trajectories`` view) only the matching sessions go
    into the dataset files and the archive files are left out: such an export cannot be imported.

    ``checkpoints``: also the sandbox checkpoints of the exported sessions, their manifests and
    blobs (:mod:`dressage.exports.checkpoints`; ``parquet`` only).
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"export directory {out} exists and is not empty; choose a new directory")
    if fmt not in EXPORT_FORMATS:
        raise StoreError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if checkpoints and fmt != "parquet":
        raise StoreError("--checkpoints needs --format parquet: an sft export holds chat messages only")
    r = store.runs.get(run)
    checker = SftRows(sft_profile(r.config)) if fmt == "sft" else None
    sessions = session_rows(store, r)
    n_per_prompt = _n_samples_per_prompt(sessions)  # of the whole run: rollout ids as the trainer's
    if where is not None:
        keep = select_sessions(store.db, r.name, where)
        sessions = [s for s in sessions if s["session_id"] in keep]
    out.mkdir(parents=True, exist_ok=True)
    if checker is not None:
        counts = _write_sft(store, r, sessions, out, n_per_prompt, checker)
        if progress is not None:
            progress(len(sessions), len(sessions))
    else:
        counts = _write_dataset(store, r, sessions, out, n_per_prompt, batch_sessions, progress)
    if where is None and checker is None:
        counts |= _write_archive(store, r, out)
    if checkpoints:
        counts |= write_checkpoints(store, [s["session_id"] for s in sessions], out)
    files = {
        p.relative_to(out).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "format": tb.FORMAT,
        "format_version": tb.FORMAT_VERSION,
        "schema_version": tb.SCHEMA_VERSION,
        "run": r.name,
        "config": r.config,
        "config_hash": r.config_hash,
        "run_created_at": r.created_at,
        "dataset": fmt,
        "complete": where is None and checker is None,
        "where": where,
        "exported_at": time.time(),
        "backend": store.db.dialect,
        "schema_revision": store.db.schema_revision(),
        "last_position": store.db.last_position(r.id),
        "counts": counts,
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return manifest


def _write_sft(
    store: EventStore,
    run: Run,
    sessions: list[dict[str, Any]],
    out: Path,
    n_per_prompt: int,
    checker: SftRows,
) -> dict[str, int]:
    """``sft.parquet``: one row per training sample, re-rendered and flagged (see the module)."""
    rows: list[dict[str, Any]] = []
    turns = turn_rows(store, run, [s["session_id"] for s in sessions])
    by_session: dict[str, list[dict[str, Any]]] = {s["session_id"]: [] for s in sessions}
    for row in turns:
        by_session[row["session_id"]].append(row)
    for s in sessions:
        by_id = {x["id"]: x for x in by_session[s["session_id"]]}
        for sample in _samples(s, by_session[s["session_id"]], n_per_prompt):
            params = by_id[sample.turn_ids[-1]]["sampling_params"] or {}
            tools = params.get("tools") if isinstance(params.get("tools"), list) else None
            rows.append(checker.row(sample, tools))
    table = sft_table(rows, checker)
    pq.write_table(table, out / SFT_FILE, compression="zstd")
    flagged = sum(1 for x in table.column("exact").to_pylist() if not x)
    return {"sessions": len(sessions), "sft_rows": table.num_rows, "flagged": flagged}


def _n_samples_per_prompt(sessions: list[dict[str, Any]]) -> int:
    """Samples per task, as the trainer numbers rollouts (``group * n + sample``)."""
    return max((s["sample_index"] + 1 for s in sessions if s["sample_index"] is not None), default=1)


def _write_dataset(
    store: EventStore,
    run: Run,
    sessions: list[dict[str, Any]],
    out: Path,
    n_per_prompt: int,
    batch_sessions: int,
    progress: Progress | None,
) -> dict[str, int]:
    counts = {"sessions": 0, "turns": 0, "samples": 0, "tokens": 0, "trained_tokens": 0}
    with ExitStack() as stack:
        writers = {name: _writer(stack, out, name, schema) for name, schema in tb.DATASET_FILES.items()}
        for start in range(0, max(len(sessions), 1), batch_sessions):
            batch = sessions[start : start + batch_sessions]
            rows = turn_rows(store, run, [s["session_id"] for s in batch])
            by_session: dict[str, list[dict[str, Any]]] = {s["session_id"]: [] for s in batch}
            for row in rows:
                by_session[row["session_id"]].append(row)
            samples = [x for s in batch for x in _samples(s, by_session[s["session_id"]], n_per_prompt)]
            writers["turns"].write_table(_turns_table(rows, {s["session_id"]: s for s in batch}))
            writers["sessions"].write_table(_sessions_table(batch, by_session))
            writers["samples"].write_table(_samples_table(samples))
            counts["sessions"] += len(batch)
            counts["turns"] += len(rows)
            counts["samples"] += len(samples)
            counts["tokens"] += sum(int(x["n_context"] + x["n_generated"]) for x in rows)
            counts["trained_tokens"] += sum(_n_trained(by_session[s["session_id"]], s) for s in batch)
            if progress is not None:
                progress(counts["sessions"], len(sessions))
    return counts


def _samples(session: dict[str, Any], rows: list[dict[str, Any]], n_per_prompt: int) -> list[TrainSample]:
    """The session's training samples, as the trainer materializes a finished train session."""
    if session["kind"] != "train" or session["status"] != "finished" or session["reward"] is None:
        return []
    rid = rollout_id_of(session["group_index"], session["sample_index"], n_per_prompt)
    traj = Trajectory(
        session["session_id"], float(session["reward"]), "completed", rid, session["group_index"], rid
    )
    try:
        return materialize_trajectory([as_turn(x) for x in rows], traj)
    except TrainingError:
        return []  # the trainer drops such a group too ("invalid"); its turns are still exported


def _turns_table(rows: list[dict[str, Any]], sessions: dict[str, dict[str, Any]]) -> pa.Table:
    def col(name: str) -> list[Any]:
        return [x[name] for x in rows]

    def task(name: str) -> list[Any]:
        return [sessions[x["session_id"]][name] for x in rows]

    experts = [x["routed_experts"] for x in rows]
    data: dict[str, Any] = {
        "session_id": col("session_id"),
        "turn_id": col("id"),
        **{c: col(c) for c in ("turn_index", "thread_index", "parent_turn_id", "route")},
        **{c: col(c) for c in ("segment_index", "segment_offset", "boundary_reason")},
        **{c: task(c) for c in ("kind", "task_index", "group_index", "sample_index")},
        "context_ids": list_column(col("context_ids"), pa.int32()),
        "generated_ids": list_column(col("generated_ids"), pa.int32()),
        "logprobs": list_column(col("logprobs"), pa.float32()),
        "loss_mask": list_column(col("loss_mask"), pa.bool_()),
        "policy_versions": list_column(col("policy_versions"), pa.int32()),
        "routed_experts": cube_column(experts),
        "routed_experts_shape": [None if e is None else list(e.shape) for e in experts],
        "routed_experts_dtype": [None if e is None else e.dtype.name for e in experts],
        **{c: col(c) for c in ("n_context", "n_generated", "n_trained", "finish_reason")},
        "sampling_params": [tb.canonical(x or {}) for x in col("sampling_params")],
        **{c: col(c) for c in ("request_fingerprint", "content_hash", "latency_ms")},
        "info": [tb.canonical(x or {}) for x in col("info")],
        "position": col("position"),
        "created_at": col("created_at"),
    }
    return pa.Table.from_pydict(data, schema=tb.TURNS)


def _n_trained(turns: list[dict[str, Any]], session: dict[str, Any]) -> int:
    """A session's trained tokens, as the ``trajectories`` view counts them (0 for an eval session)."""
    return 0 if session["kind"] == "eval" else sum(int(x["n_trained"]) for x in turns)


def _sessions_table(batch: list[dict[str, Any]], by_session: dict[str, list[dict[str, Any]]]) -> pa.Table:
    rows = []
    for s in batch:
        turns = by_session[s["session_id"]]
        rows.append(
            s
            | {
                "info": tb.canonical(s["info"] or {}),
                "n_turns": len(turns),
                "n_segments": len({x["segment_index"] for x in turns}),
                "n_tokens": sum(int(x["n_context"] + x["n_generated"]) for x in turns),
                "n_trained_tokens": _n_trained(turns, s),
            }
        )
    return tb.table_of(tb.SESSIONS, rows)


def _samples_table(samples: list[TrainSample]) -> pa.Table:
    data: dict[str, Any] = {
        **{c: [getattr(s, c) for s in samples] for c in ("session_id", "segment_index", "thread_index")},
        "is_anchor": [s.is_anchor for s in samples],
        "turn_ids": [s.turn_ids for s in samples],
        "tokens": list_column([s.tokens for s in samples], pa.int32()),
        "response_length": [s.response_length for s in samples],
        "loss_mask": list_column([s.loss_mask for s in samples], pa.int32()),
        "rollout_log_probs": list_column([s.rollout_log_probs for s in samples], pa.float32()),
        "policy_versions": list_column([s.policy_versions for s in samples], pa.int32()),
        **{c: [getattr(s, c) for s in samples] for c in ("reward", "status", "index", "group_index")},
        "rollout_id": [s.rollout_id for s in samples],
    }
    return pa.Table.from_pydict(data, schema=tb.SAMPLES)


def portable_task_refs(payload: dict[str, Any], mapping: dict[int, int]) -> dict[str, Any]:
    """``payload`` with its ``task_id`` (a task row id) replaced through ``mapping``.

    Task row ids are local to a database; an export numbers a run's tasks 1..N in id order
    (``tasks.parquet`` ``task_number``) and event payloads refer to that number, which ``import``
    maps to the new log's ids. Other payloads are returned as they are.
    """
    task_id = payload.get("task_id")
    if isinstance(task_id, int) and not isinstance(task_id, bool) and task_id in mapping:
        return {**payload, "task_id": mapping[task_id]}
    return payload


def _events(store: EventStore, run: Run, task_numbers: dict[int, int]) -> Iterator[pa.Table]:
    batch: list[dict[str, Any]] = []
    for e in store.events.tail(run):
        batch.append(
            {
                "position": e.position,
                "kind": e.kind,
                "session_id": e.session_id,
                "idem_key": e.key,
                "content_hash": e.content_hash,
                "payload": tb.canonical(portable_task_refs(e.payload, task_numbers)),
                "created_at": e.created_at,
            }
        )
        if len(batch) >= 10_000:
            yield tb.table_of(tb.EVENTS, batch)
            batch = []
    yield tb.table_of(tb.EVENTS, batch)


def _write_archive(store: EventStore, run: Run, out: Path) -> dict[str, int]:
    """The files ``import`` needs besides the dataset: events, tasks, versions, steps, artifacts."""
    counts = {"events": 0}
    task_rows = table_rows(store, run, t.tasks, ["id"])
    numbers = {int(row["id"]): i + 1 for i, row in enumerate(task_rows)}
    with pq.ParquetWriter(out / "events.parquet", tb.EVENTS, compression="zstd") as w:
        for table in _events(store, run, numbers):
            w.write_table(table)
            counts["events"] += table.num_rows
    specs = {  # table, row order, its JSON columns
        "tasks": (t.tasks, ["id"], {"payload"}),
        "policy_versions": (t.policy_versions, ["version"], set()),
        "train_steps": (t.train_steps, ["consumer", "step"], {"manifest"}),
        "step_metrics": (t.train_step_metrics, ["consumer", "step", "name"], set()),
        "token_decisions": (t.train_token_decisions, ["consumer", "step", "sample"], set()),
        "consumer_checkpoints": (t.consumer_checkpoints, ["consumer"], {"state"}),
        "artifacts": (t.artifacts, ["position"], set()),
    }
    for name, (table, order, json_columns) in specs.items():
        schema = tb.ARCHIVE_FILES[name]
        rows = [
            {c: tb.canonical(row[c]) if c in json_columns else row.get(c) for c in schema.names}
            | ({"task_number": i + 1} if name == "tasks" else {})
            for i, row in enumerate(table_rows(store, run, table, order))
        ]
        pq.write_table(tb.table_of(schema, rows), out / f"{name}.parquet", compression="zstd")
        counts[name] = len(rows)
    refs = store.artifacts.list(run)
    if refs:
        (out / "artifacts").mkdir()
    for ref in refs:
        blob = out / "artifacts" / ref.sha256
        if not blob.exists():
            blob.write_bytes(store.artifacts.get(ref))
    return counts
