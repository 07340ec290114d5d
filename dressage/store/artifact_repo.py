"""Artifacts in the log.

Artifact bytes go to a :class:`~dressage.store.artifacts.BlobStore`; the log records sha256, size,
media type and URI with an ``artifact`` event.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, insert, select

from dressage.errors import StoreError
from dressage.store import schema as t
from dressage.store.artifacts import BlobStore
from dressage.store.database import Database
from dressage.store.records import ArtifactRef, Run, check_text, deterministic_key
from dressage.store.runs import RunRepository


class ArtifactRepository:
    """Artifacts of the log's runs; their bytes live in a :class:`BlobStore`."""

    def __init__(self, db: Database, runs: RunRepository, blobs: BlobStore | None) -> None:
        self.db = db
        self.runs = runs
        self.blobs = blobs

    def put(
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
        r = self.runs.get(run)
        sha, uri = self.blobs.put(data)

        def tx(conn: Connection) -> ArtifactRef:
            key = deterministic_key(r.name, "artifact", session_id, name, sha)
            res = self.db.append_event_tx(
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

        return self.db.retrying(tx)

    def list(self, run: str | Run, *, session_id: str | None = None) -> list[ArtifactRef]:
        """Artifacts of a run (or one session), oldest first."""
        r = self.runs.get(run)
        q = select(t.artifacts).where(t.artifacts.c.run_id == r.id)
        if session_id is not None:
            q = q.where(t.artifacts.c.session_id == session_id)
        with self.db.read() as conn:
            return [_ref(x) for x in conn.execute(q.order_by(t.artifacts.c.id)).all()]

    def get(self, ref: ArtifactRef) -> bytes:
        """The bytes of an artifact, checked against its sha256."""
        if self.blobs is None:
            raise StoreError("this store has no blob store configured")
        return self.blobs.get(ref.uri)


def _ref(row: object) -> ArtifactRef:
    return ArtifactRef(row.id, row.session_id, row.name, row.sha256, row.size, row.media_type, row.uri)  # type: ignore[attr-defined]
