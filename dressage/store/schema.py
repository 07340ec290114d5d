"""The event log's tables: one schema for PostgreSQL and SQLite.

The log's rules (docs/architecture.md, "The log's rules") that shape these tables:

* ``events`` is the log: a dense, commit-ordered ``position`` per run taken from the counter row in
  ``run_counters`` inside the append transaction, and an idempotency key unique per run.
* ``turns`` holds one row per LLM call with per-token arrays (never one row per token).
* ``sessions`` and ``tasks`` summarise current state; every change that history needs is also an
  event, so they are projections of the log.
* Big blobs (sandbox archives, agent logs) live outside: ``artifacts`` keeps sha256, size and URI.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Computed,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from dressage.store.types import BoolArray, FloatArray, IntArray, JsonDoc, SmallIntArray

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("config", JsonDoc, nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)

run_counters = Table(
    "run_counters",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("last_position", BigInteger, nullable=False),
)

# The two hot tables (events, turns) carry no foreign keys: their referential checks cost a third of
# an append on PostgreSQL, and the append statement itself checks that the run's counter row and a
# running session exist (turn_io.PG_APPEND_TURN_SQL). drop_run deletes their rows explicitly.
# A turn's key (``turns.id``) is unique through the event that records it (events.idem_key), so
# turns are keyed by (run_id, position) and carry no second index for the key.
events = Table(
    "events",
    metadata,
    Column("run_id", Integer, primary_key=True, autoincrement=False),
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", String(64), nullable=False),
    Column("session_id", String(64), nullable=True),
    Column("idem_key", String(128), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("payload", JsonDoc, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("run_id", "idem_key"),
    # Not (run_id, session_id): a generic plan then preferred it for key lookups (migration 0003).
    Index(None, "session_id"),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("task_index", Integer, nullable=False),
    Column("group_index", Integer, nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("payload", JsonDoc, nullable=False),
    Column("state", String(16), nullable=False),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_at", Float, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("updated_at", Float, nullable=False),
    # "train" or "eval": eval tasks are sampled with the policy of ``eval_version`` and never trained
    Column("kind", String(8), nullable=False, server_default="train"),
    Column("eval_version", Integer, nullable=True),
    UniqueConstraint("run_id", "kind", "task_index", "sample_index"),
    Index(None, "run_id", "state"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("task_id", Integer, ForeignKey("tasks.id", ondelete="SET NULL"), nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("agent", String(200), nullable=True),
    Column("sandbox", String(200), nullable=True),
    Column("status", String(16), nullable=False),
    Column("reward", Float, nullable=True),
    Column("finish_reason", String(64), nullable=True),
    Column("error", Text, nullable=True),
    Column("token_sha256", String(64), nullable=True, unique=True),
    Column("info", JsonDoc, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    # A forked session (``dressage-worker fork``): the session it was forked from and how many of
    # that session's turns it starts with (its turns ``0 .. fork_turn - 1`` are the parent's, replayed
    # from the log). Both NULL for a session that is no fork (a root). No foreign key (migration
    # 0007): the store checks the parent when a fork opens, and one whose parent was dropped is a root.
    Column("parent_session_id", String(64), nullable=True),
    Column("fork_turn", Integer, nullable=True),
    Index(None, "run_id", "status"),
    Index(None, "task_id"),
    Index(None, "parent_session_id"),
)

turns = Table(
    "turns",
    metadata,
    Column("id", String(64), nullable=False),
    Column("run_id", Integer, primary_key=True, autoincrement=False),
    Column("session_id", String(64), nullable=False),
    Column("turn_index", Integer, nullable=False),
    Column("thread_index", Integer, nullable=False),
    # The column's name before migration 0005, kept one release for users' queries (read-only).
    Column("lineage_index", Integer, Computed("thread_index")),
    Column("parent_turn_id", String(64), nullable=True),
    Column("route", String(16), nullable=False),
    Column("segment_index", Integer, nullable=False),
    Column("segment_offset", Integer, nullable=False),
    Column("boundary_reason", String(64), nullable=True),
    Column("context_ids", IntArray, nullable=False),
    Column("generated_ids", IntArray, nullable=False),
    Column("logprobs", FloatArray, nullable=False),
    Column("loss_mask", BoolArray, nullable=False),
    Column("policy_versions", IntArray, nullable=False),
    Column("n_context", Integer, nullable=False),
    Column("n_generated", Integer, nullable=False),
    Column("n_trained", Integer, nullable=False),
    Column("min_policy_version", Integer, nullable=True),
    Column("max_policy_version", Integer, nullable=True),
    Column("experts", LargeBinary, nullable=True),
    Column("experts_shape", IntArray, nullable=True),
    Column("experts_dtype", String(16), nullable=True),
    Column("experts_codec", String(16), nullable=True),
    Column("finish_reason", String(32), nullable=True),
    Column("sampling_params", JsonDoc, nullable=False),
    Column("request_fingerprint", String(64), nullable=True),
    Column("content_hash", String(64), nullable=False),
    Column("latency_ms", Float, nullable=True),
    Column("info", JsonDoc, nullable=False),
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("session_id", "turn_index"),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("session_id", String(64), ForeignKey("sessions.id", ondelete="CASCADE"), nullable=True),
    Column("name", String(200), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("media_type", String(100), nullable=False),
    Column("uri", Text, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Index(None, "session_id"),
)

sandbox_checkpoints = Table(
    # One sandbox checkpoint per (session, turn): the state its writable folders held when request
    # ``turn_index`` reached the proxy (dressage/paddock/checkpoints.py). The manifest is a blob
    # (sha256 + URI, the log's rule 7); an unchanged tree has the same manifest hash as the turn before.
    "sandbox_checkpoints",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("session_id", String(64), ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    Column("turn_index", Integer, primary_key=True, autoincrement=False),
    Column("manifest_sha256", String(64), nullable=False),
    Column("manifest_uri", Text, nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("hashed_bytes", BigInteger, nullable=False),  # bytes read and hashed for it (stat cache misses)
    # The agent's request K (its body as JSON, redacted; a blob) and the digest of the prompt ids it
    # rendered to: the conversation a resumed agent starts from, and what its first request must equal.
    Column("request_sha256", String(64), nullable=True),
    Column("request_uri", Text, nullable=True),
    Column("prompt_digest", String(64), nullable=True),
    Column("position", BigInteger, nullable=False),  # its ``checkpoint`` event
    Column("created_at", Float, nullable=False),
)

sandbox_checkpoint_changes = Table(
    # What a checkpoint changed against the session's previous checkpoint (or its fork parent's at the
    # fork turn): one row per path added, modified or removed; an unchanged tree has none.
    "sandbox_checkpoint_changes",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("turn_index", Integer, primary_key=True, autoincrement=False),
    Column("path", Text, primary_key=True),
    Column("change", String(16), nullable=False),
    Column("kind", String(16), nullable=True),  # file, dir, symlink (NULL: removed)
    Column("mode", Integer, nullable=True),
    Column("size", BigInteger, nullable=True),
    Column("sha256", String(64), nullable=True),
    ForeignKeyConstraint(
        ["session_id", "turn_index"],
        ["sandbox_checkpoints.session_id", "sandbox_checkpoints.turn_index"],
        ondelete="CASCADE",
    ),
)

policy_versions = Table(
    "policy_versions",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("checkpoint_uri", Text, nullable=True),
    Column("position", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
)

consumer_checkpoints = Table(
    "consumer_checkpoints",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("consumer", String(200), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("step", Integer, nullable=False),
    Column("state", JsonDoc, nullable=False),
    Column("updated_at", Float, nullable=False),
)

train_steps = Table(
    "train_steps",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("consumer", String(200), primary_key=True),
    Column("step", Integer, primary_key=True, autoincrement=False),
    Column("position", BigInteger, nullable=False),
    Column("batch_hash", String(64), nullable=False),
    Column("manifest", JsonDoc, nullable=False),
    Column("created_at", Float, nullable=False),
)

train_step_metrics = Table(
    "train_step_metrics",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("consumer", String(200), primary_key=True),
    Column("step", Integer, primary_key=True, autoincrement=False),
    Column("name", String(64), primary_key=True),
    # NULL on SQLite for a NaN (SQLite stores no NaN); PostgreSQL keeps NaN
    Column("value", Float(precision=53), nullable=True),
)

train_token_decisions = Table(
    "train_token_decisions",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("consumer", String(200), primary_key=True),
    Column("step", Integer, primary_key=True, autoincrement=False),
    Column("sample", Integer, primary_key=True, autoincrement=False),  # its index in the step
    Column("session_id", String(64), nullable=False),
    Column("segment_index", Integer, nullable=False),
    Column("response_start", Integer, nullable=False),  # segment position of response token 0
    Column("advantage", Float(precision=53), nullable=False),
    Column("mask_reasons", SmallIntArray, nullable=False),  # [R] codes of mask_reasons
    Column("importance_weights", FloatArray, nullable=True),  # [R] float32; NULL: not computed here
    Index(None, "session_id", "segment_index"),
)

mask_reasons = Table(
    "mask_reasons",
    metadata,
    Column("code", Integer, primary_key=True, autoincrement=False),
    Column("reason", String(32), nullable=False, unique=True),
    Column("meaning", Text, nullable=False),
)

ALL_TABLES = (
    runs,
    run_counters,
    events,
    tasks,
    sessions,
    turns,
    artifacts,
    sandbox_checkpoints,
    sandbox_checkpoint_changes,
    policy_versions,
    consumer_checkpoints,
    train_steps,
    train_step_metrics,
    train_token_decisions,
    mask_reasons,
)
