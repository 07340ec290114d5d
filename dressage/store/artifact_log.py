"""Artifacts and policy versions in the log.

Artifact bytes go to a :class:`~dressage.store.artifacts.BlobStore`; the log records sha256, size,
media type and URI with an ``artifact`` event. Policy versions (weight updates) are events too.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, func, insert, select

from dressage.errors import InvalidRecordError, StoreError
from dressage.store import schema as t
from dressage.store.members import StoreMembers
from dressage.store.records import AppendResult, ArtifactRef, Run, check_text, deterministic_key


class ArtifactLogMixin(StoreMembers):
    """Artifact and policy-version methods of the event store."""

    def put_artifact(
        self,
        run: str | Run,
        data: bytes,
        *,
        name: str,
        media_type: str = "application/octet-stream",
        session_id: str | None = None,
    ) -> ArtifactRef:
        """Store ``data`` content-addressed and record it (linked to ``session_id`` if given)."""
        if self.blobs is None:
            raise StoreError("this store has no blob store configured; open it with EventStore.open()")
        check_text(name, what="artifact name", max_chars=200)
        check_text(media_type, what="media type", max_chars=100)
        r = self.get_run(run)
        sha, uri = self.blobs.put(data)

        def tx(conn: Connection) -> ArtifactRef:
            key = deterministic_key(r.name, "artifact", session_id, name, sha)
            res = self._append_event_tx(
                conn,
                r.id,
                "artifact",
                {"name": name, "sha256": sha, "size": len(data), "media_type": media_type, "uri": uri},
                key=key,
                session_id=session_id,
            )
            if res.duplicate:
                row = conn.execute(
                    select(t.artifacts).where(
                        t.artifacts.c.position == res.position, t.artifacts.c.run_id == r.id
                    )
                ).one()
                return _ref(row)
            art_id = conn.execute(
                insert(t.artifacts)
                .values(
                    run_id=r.id,
                    session_id=session_id,
                    name=name,
                    sha256=sha,
                    size=len(data),
                    media_type=media_type,
                    uri=uri,
                    position=res.position,
                    created_at=time.time(),
                )
                .returning(t.artifacts.c.id)
            ).scalar_one()
            return ArtifactRef(art_id, session_id, name, sha, len(data), media_type, uri)

        return self._retrying(tx)

    def list_artifacts(self, run: str | Run, *, session_id: str | None = None) -> list[ArtifactRef]:
        """Artifacts of a run (or one session), oldest first."""
        r = self.get_run(run)
        q = select(t.artifacts).where(t.artifacts.c.run_id == r.id)
        if session_id is not None:
            q = q.where(t.artifacts.c.session_id == session_id)
        with self._read() as conn:
            return [_ref(x) for x in conn.execute(q.order_by(t.artifacts.c.id)).all()]

    def get_artifact(self, ref: ArtifactRef) -> bytes:
        """The bytes of an artifact, checked against its sha256."""
        if self.blobs is None:
            raise StoreError("this store has no blob store configured")
        return self.blobs.get(ref.uri)

    def record_policy_version(
        self, run: str | Run, version: int, checkpoint_uri: str | None = None
    ) -> AppendResult:
        """Record that the engines now serve weights ``version`` (idempotent per version)."""
        if not isinstance(version, int) or version < 0:
            raise InvalidRecordError(f"policy version must be a non-negative integer, got {version!r}")
        check_text(checkpoint_uri, what="checkpoint URI", max_chars=4096)
        r = self.get_run(run)

        def tx(conn: Connection) -> AppendResult:
            res = self._append_event_tx(
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

        return self._retrying(tx)

    def latest_policy_version(self, run: str | Run) -> int | None:
        """The newest recorded policy version of a run, or None."""
        r = self.get_run(run)
        with self._read() as conn:
            return conn.execute(
                select(func.max(t.policy_versions.c.version)).where(t.policy_versions.c.run_id == r.id)
            ).scalar_one()


def _ref(row: object) -> ArtifactRef:
    return ArtifactRef(row.id, row.session_id, row.name, row.sha256, row.size, row.media_type, row.uri)  # type: ignore[attr-defined]
