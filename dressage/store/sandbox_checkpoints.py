"""Sandbox checkpoints in the log: one row per (session, turn), the paths each one changed.

A checkpoint's manifest (:mod:`dressage.paddock.checkpoints`: every file's path, mode, size and
sha256) is a blob of the store's :class:`~dressage.store.artifacts.BlobStore`, as its files' bytes
are; the log keeps the manifest's sha256 and URI, its counts, the rows of ``workspace_changes``
(what changed against the checkpoint before) and a ``checkpoint`` event, all in one transaction.
Recording the same (session, turn) again with the same manifest returns the stored row (a proxy
retry, a take-over that restored it); with another manifest it is refused (the log's rule 3).

Retention (``checkpoints.keep`` in the rollout config) removes rows with :meth:`prune`, which
appends a ``checkpoints_pruned`` event naming the turns (the log's rule 6: history says what was
dropped). Blobs are not deleted: other checkpoints, sessions and runs share them by content.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select

from dressage.errors import StoreError
from dressage.store import schema as t
from dressage.store.artifacts import BlobStore
from dressage.store.database import Database
from dressage.store.records import Run, deterministic_key
from dressage.store.runs import RunRepository

CHANGES = ("added", "modified", "removed")
"""The ``change`` of a ``workspace_changes`` row."""


@dataclass(frozen=True)
class CheckpointChange:
    """One path a checkpoint changed: the new entry's facts (None for ``removed``)."""

    path: str
    change: str
    kind: str | None = None
    mode: int | None = None
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class SandboxCheckpoint:
    """One recorded checkpoint: the sandbox's state when request ``turn_index`` reached the proxy."""

    session_id: str
    turn_index: int
    manifest_sha256: str
    manifest_uri: str
    files: int
    bytes: int
    hashed_bytes: int
    position: int = 0
    request_sha256: str | None = None
    request_uri: str | None = None
    """The agent's request at this turn (its body as JSON, redacted), a blob."""
    prompt_digest: str | None = None
    """sha256 of the prompt ids request ``turn_index`` rendered to (:func:`dressage.proxy.replay.ids_digest`)."""


class SandboxCheckpointRepository:
    """Sandbox checkpoints of the log's sessions (see the module docstring)."""

    def __init__(self, db: Database, runs: RunRepository, blobs: BlobStore | None) -> None:
        self.db = db
        self.runs = runs
        self.blobs = blobs

    def put_manifest(self, data: bytes) -> tuple[str, str]:
        """Store a manifest's (or a request's) bytes (content-addressed); ``(sha256, uri)``."""
        return self._blobs().put(data)

    def read_manifest(self, checkpoint: SandboxCheckpoint) -> bytes:
        """The manifest's bytes, checked against its sha256 by the blob store."""
        return self._blobs().get(checkpoint.manifest_uri)

    def read_request(self, checkpoint: SandboxCheckpoint) -> bytes | None:
        """The agent's recorded request at the checkpoint's turn (None: none was recorded)."""
        return None if checkpoint.request_uri is None else self._blobs().get(checkpoint.request_uri)

    def _blobs(self) -> BlobStore:
        if self.blobs is None:
            raise StoreError("this store has no blob store configured; open it with EventStore.open()")
        return self.blobs

    def record(
        self,
        run: str | Run,
        checkpoint: SandboxCheckpoint,
        changes: Sequence[CheckpointChange],
    ) -> SandboxCheckpoint:
        """Record ``checkpoint`` (its ``position`` is ignored) and its ``changes``; idempotent."""
        r = self.runs.get(run)
        bad = [c.change for c in changes if c.change not in CHANGES]
        if bad:
            raise ValueError(f"checkpoint change must be one of {CHANGES}, got {bad[0]!r}")
        payload = {
            "turn_index": checkpoint.turn_index,
            "manifest_sha256": checkpoint.manifest_sha256,
            "files": checkpoint.files,
            "bytes": checkpoint.bytes,
            "changes": len(changes),
            "prompt_digest": checkpoint.prompt_digest,
        }
        key = deterministic_key(r.name, checkpoint.session_id, "checkpoint", checkpoint.turn_index)

        def tx(conn: Connection) -> SandboxCheckpoint:
            res = self.db.append_event_tx(
                conn, r.id, "checkpoint", payload, key=key, session_id=checkpoint.session_id
            )
            if res.duplicate:
                found = _get(conn, checkpoint.session_id, checkpoint.turn_index)
                if found is None:  # recorded, then pruned: the event stays, the row does not
                    return dataclasses.replace(checkpoint, position=res.position)
                return found
            row = {**checkpoint.__dict__, "position": res.position}
            conn.execute(insert(t.sandbox_checkpoints).values(run_id=r.id, created_at=time.time(), **row))
            if changes:
                conn.execute(
                    insert(t.sandbox_checkpoint_changes),
                    [
                        {
                            "session_id": checkpoint.session_id,
                            "turn_index": checkpoint.turn_index,
                            **c.__dict__,
                        }
                        for c in changes
                    ],
                )
            return SandboxCheckpoint(**row)

        return self.db.retrying(tx)

    def get(self, session_id: str, turn_index: int) -> SandboxCheckpoint | None:
        """The checkpoint of ``session_id`` at ``turn_index`` (None: none was taken or kept)."""
        with self.db.read() as conn:
            return _get(conn, session_id, turn_index)

    def by_session(self, session_id: str) -> list[SandboxCheckpoint]:
        """A session's checkpoints, by turn."""
        q = (
            select(t.sandbox_checkpoints)
            .where(t.sandbox_checkpoints.c.session_id == session_id)
            .order_by(t.sandbox_checkpoints.c.turn_index)
        )
        with self.db.read() as conn:
            return [_checkpoint(x) for x in conn.execute(q).all()]

    def changes(self, session_id: str, turn_index: int) -> list[CheckpointChange]:
        """The paths the checkpoint at ``turn_index`` changed, by path."""
        c = t.sandbox_checkpoint_changes.c
        q = (
            select(c.path, c.change, c.kind, c.mode, c.size, c.sha256)
            .where(c.session_id == session_id, c.turn_index == turn_index)
            .order_by(c.path)
        )
        with self.db.read() as conn:
            return [CheckpointChange(*x) for x in conn.execute(q).all()]

    def prune(self, run: str | Run, session_id: str, turns: Sequence[int], reason: str) -> list[int]:
        """Remove the checkpoints of ``turns`` (retention) with a ``checkpoints_pruned`` event; the
        turns that had one."""
        r = self.runs.get(run)
        k = t.sandbox_checkpoints.c

        def tx(conn: Connection) -> list[int]:
            held = conn.execute(
                select(k.turn_index).where(k.session_id == session_id, k.turn_index.in_(list(turns)))
            ).scalars()
            gone = sorted(int(x) for x in held)
            if not gone:
                return []
            conn.execute(
                delete(t.sandbox_checkpoint_changes).where(
                    t.sandbox_checkpoint_changes.c.session_id == session_id,
                    t.sandbox_checkpoint_changes.c.turn_index.in_(gone),
                )
            )
            conn.execute(
                delete(t.sandbox_checkpoints).where(k.session_id == session_id, k.turn_index.in_(gone))
            )
            self.db.append_event_tx(
                conn,
                r.id,
                "checkpoints_pruned",
                {"turns": gone, "reason": reason},
                key=deterministic_key(r.name, session_id, "checkpoints_pruned", *gone),
                session_id=session_id,
            )
            return gone

        return self.db.retrying(tx)


def _get(conn: Connection, session_id: str, turn_index: int) -> SandboxCheckpoint | None:
    k = t.sandbox_checkpoints.c
    row = conn.execute(
        select(t.sandbox_checkpoints).where(k.session_id == session_id, k.turn_index == turn_index)
    ).first()
    return None if row is None else _checkpoint(row)


def _checkpoint(row: object) -> SandboxCheckpoint:
    r = row._mapping  # type: ignore[attr-defined]
    return SandboxCheckpoint(
        session_id=r["session_id"],
        turn_index=int(r["turn_index"]),
        manifest_sha256=r["manifest_sha256"],
        manifest_uri=r["manifest_uri"],
        files=int(r["files"]),
        bytes=int(r["bytes"]),
        hashed_bytes=int(r["hashed_bytes"]),
        position=int(r["position"]),
        request_sha256=r["request_sha256"],
        request_uri=r["request_uri"],
        prompt_digest=r["prompt_digest"],
    )
