"""The Arrow schema of every file of an export (``docs/export.md`` documents each column).

Dataset files, written for every export (a ``--where`` export too):

* ``turns.parquet``: one row per turn (LLM call), the per-token arrays exactly as recorded.
* ``sessions.parquet``: one row per session (trajectory) with its task's keys, reward and status.
* ``samples.parquet``: one row per training sample (one segment of one finished train session) as
  the trainer materializes it, before the step-dependent version mask and advantages.

Archive files, written only for a whole run (what ``import`` needs to rebuild it): ``events``,
``tasks``, ``policy_versions``, ``train_steps``, ``step_metrics`` (``train_step_metrics``),
``token_decisions`` (``train_token_decisions``), ``consumer_checkpoints`` and ``artifacts`` (the
blobs under ``artifacts/<sha256>``). An export written before ``step_metrics`` and
``token_decisions`` existed imports without them (its steps carry none).

Nothing database-local is exported (run, task and artifact ids, artifact URIs, session token
hashes; a ``task_id`` in an event payload becomes the task's ``task_number``, 1..N in the
order the run enqueued its tasks), and JSON documents are written in canonical form (sorted keys), so exporting an imported
run gives byte-identical files. Rows are in a fixed order (sessions by id, turns by session then
turn index, events by position, tasks by number).
"""

from __future__ import annotations

import orjson
import pyarrow as pa

FORMAT = "dressage-run-export"
FORMAT_VERSION = 2
SCHEMA_VERSION = "2"
"""Bumped when a column changes; stored in each file's schema metadata as ``dressage.schema``."""

_i32, _i64, _f32, _f64, _str, _bool = (
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.bool_(),
)


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(fields), metadata={"dressage.schema": SCHEMA_VERSION})


TURNS = _schema(
    ("session_id", _str),
    ("turn_id", _str),
    ("turn_index", _i32),
    ("thread_index", _i32),
    ("parent_turn_id", _str),
    ("route", _str),
    ("segment_index", _i32),
    ("segment_offset", _i32),
    ("boundary_reason", _str),
    ("kind", _str),
    ("task_index", _i32),
    ("group_index", _i32),
    ("sample_index", _i32),
    ("context_ids", pa.list_(_i32)),
    ("generated_ids", pa.list_(_i32)),
    ("logprobs", pa.list_(_f32)),
    ("loss_mask", pa.list_(_bool)),
    ("policy_versions", pa.list_(_i32)),
    ("routed_experts", pa.list_(pa.list_(pa.list_(_i32)))),
    ("routed_experts_shape", pa.list_(_i32)),
    ("routed_experts_dtype", _str),
    ("n_context", _i32),
    ("n_generated", _i32),
    ("n_trained", _i32),
    ("finish_reason", _str),
    ("sampling_params", _str),
    ("request_fingerprint", _str),
    ("content_hash", _str),
    ("latency_ms", _f64),
    ("info", _str),
    ("position", _i64),
    ("created_at", _f64),
)

SESSIONS = _schema(
    ("session_id", _str),
    ("kind", _str),
    ("task_index", _i32),
    ("group_index", _i32),
    ("sample_index", _i32),
    ("eval_version", _i32),
    ("attempt", _i32),
    ("agent", _str),
    ("sandbox", _str),
    ("status", _str),
    ("reward", _f64),
    ("finish_reason", _str),
    ("error", _str),
    ("info", _str),
    ("n_turns", _i32),
    ("n_segments", _i32),
    ("n_tokens", _i64),
    ("n_trained_tokens", _i64),
    ("created_at", _f64),
    ("finished_at", _f64),
    ("parent_session_id", _str),
    ("fork_turn", _i32),
)

SAMPLES = _schema(
    ("session_id", _str),
    ("segment_index", _i32),
    ("thread_index", _i32),
    ("is_anchor", _bool),
    ("turn_ids", pa.list_(_str)),
    ("tokens", pa.list_(_i32)),
    ("response_length", _i32),
    ("loss_mask", pa.list_(_i32)),
    ("rollout_log_probs", pa.list_(_f32)),
    ("policy_versions", pa.list_(_i32)),
    ("reward", _f64),
    ("status", _str),
    ("index", _i64),
    ("group_index", _i32),
    ("rollout_id", _i64),
)

EVENTS = _schema(
    ("position", _i64),
    ("kind", _str),
    ("session_id", _str),
    ("idem_key", _str),
    ("content_hash", _str),
    ("payload", _str),
    ("created_at", _f64),
)

TASKS = _schema(
    ("task_number", _i32),
    ("kind", _str),
    ("task_index", _i32),
    ("group_index", _i32),
    ("sample_index", _i32),
    ("eval_version", _i32),
    ("payload", _str),
    ("state", _str),
    ("lease_owner", _str),
    ("lease_expires_at", _f64),
    ("attempts", _i32),
    ("updated_at", _f64),
)

POLICY_VERSIONS = _schema(
    ("version", _i32), ("checkpoint_uri", _str), ("position", _i64), ("created_at", _f64)
)

TRAIN_STEPS = _schema(
    ("consumer", _str),
    ("step", _i32),
    ("position", _i64),
    ("batch_hash", _str),
    ("manifest", _str),
    ("created_at", _f64),
)

STEP_METRICS = _schema(("consumer", _str), ("step", _i32), ("name", _str), ("value", _f64))

TOKEN_DECISIONS = _schema(
    ("consumer", _str),
    ("step", _i32),
    ("sample", _i32),
    ("session_id", _str),
    ("segment_index", _i32),
    ("response_start", _i32),
    ("advantage", _f64),
    ("mask_reasons", pa.list_(pa.int16())),
    ("importance_weights", pa.list_(_f32)),
)

CONSUMER_CHECKPOINTS = _schema(
    ("consumer", _str), ("position", _i64), ("step", _i32), ("state", _str), ("updated_at", _f64)
)

ARTIFACTS = _schema(
    ("session_id", _str),
    ("name", _str),
    ("sha256", _str),
    ("size", _i64),
    ("media_type", _str),
    ("position", _i64),
    ("created_at", _f64),
)

DATASET_FILES = {"turns": TURNS, "sessions": SESSIONS, "samples": SAMPLES}
OPTIONAL_ARCHIVE_FILES = ("step_metrics", "token_decisions")
"""Archive files an older export may lack (import then leaves their tables empty for the run)."""

ARCHIVE_FILES = {
    "events": EVENTS,
    "tasks": TASKS,
    "policy_versions": POLICY_VERSIONS,
    "train_steps": TRAIN_STEPS,
    "step_metrics": STEP_METRICS,
    "token_decisions": TOKEN_DECISIONS,
    "consumer_checkpoints": CONSUMER_CHECKPOINTS,
    "artifacts": ARTIFACTS,
}


def canonical(doc: object) -> str:
    """A JSON document as canonical text (sorted keys): the same bytes on every backend read."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def table_of(schema: pa.Schema, rows: list[dict[str, object]]) -> pa.Table:
    """Rows of plain values (JSON columns already text) as a table of ``schema``."""
    return pa.Table.from_pylist(rows, schema=schema)
