"""Policy versions in the log: which weights the engines serve (each weight update is an event)."""

from __future__ import annotations

import time

from sqlalchemy import Connection, func, insert, select

from dressage.errors import InvalidRecordError
from dressage.store import schema as t
from dressage.store.database import Database
from dressage.store.records import AppendResult, Run, check_text, deterministic_key
from dressage.store.runs import RunRepository


class VersionRepository:
    """Policy versions of the log's runs."""

    def __init__(self, db: Database, runs: RunRepository) -> None:
        self.db = db
        self.runs = runs

    def record(self, run: str | Run, version: int, checkpoint_uri: str | None = None) -> AppendResult:
        """Record that the engines now serve weights ``version`` (idempotent per version)."""
        if not isinstance(version, int) or version < 0:
            raise InvalidRecordError(f"policy version must be a non-negative integer, got {version!r}")
        check_text(checkpoint_uri, what="checkpoint URI", max_chars=4096)
        r = self.runs.get(run)

        def tx(conn: Connection) -> AppendResult:
            res = self.db.append_event_tx(
                conn,
                r.id,
                "policy_version",
                {"version": version, "checkpoint_uri": checkpoint_uri},
                key=deterministic_key(r.name, "policy_version", version),
            )
            if not res.duplicate:
                conn.execute(
                    insert(t.policy_versions).values(
                        run_id=r.id,
                        version=version,
                        checkpoint_uri=checkpoint_uri,
                        position=res.position,
                        created_at=time.time(),
                    )
                )
            return res

        return self.db.retrying(tx)

    def latest(self, run: str | Run) -> int | None:
        """The newest recorded policy version of a run, or None."""
        r = self.runs.get(run)
        with self.db.read() as conn:
            version = conn.execute(
                select(func.max(t.policy_versions.c.version)).where(t.policy_versions.c.run_id == r.id)
            ).scalar_one()
        return None if version is None else int(version)
