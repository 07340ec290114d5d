"""The event log's Python API: a :class:`~dressage.store.database.Database` and its repositories.

``EventStore`` composes them and owns nothing else: ``store.db`` (engine, connections, retries,
positions), ``store.runs``, ``store.events``, ``store.sessions``, ``store.turns`` (whose durable
append is the backend's :class:`~dressage.store.turn_appenders.TurnAppender`), ``store.tasks``
(the task queue and its leases), ``store.consumers`` (consumer checkpoints and step manifests),
``store.versions`` (policy versions), ``store.artifacts`` and ``store.sandbox_checkpoints`` (sandbox
checkpoints per turn). Run arguments accept a run name or a
:class:`~dressage.store.records.Run`.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from dressage.config import Settings, load_settings
from dressage.errors import StoreError
from dressage.store.artifact_repo import ArtifactRepository
from dressage.store.artifacts import BlobStore, LocalBlobStore
from dressage.store.consumers import ConsumerRepository
from dressage.store.database import Database
from dressage.store.db import ensure_schema, make_engine
from dressage.store.events import EventRepository
from dressage.store.reach import cannot_open
from dressage.store.records import DEFAULT_MAX_PAYLOAD_BYTES
from dressage.store.runs import RunRepository
from dressage.store.sandbox_checkpoints import SandboxCheckpointRepository
from dressage.store.sessions import SessionRepository
from dressage.store.tasks import TaskRepository
from dressage.store.turn_appenders import make_turn_appender
from dressage.store.turns import TurnRepository
from dressage.store.versions import VersionRepository


class EventStore:
    """Typed access to the event log on SQLite or PostgreSQL.

    Build it with :meth:`open` (from settings or a URL) or directly from an engine.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        blobs: BlobStore | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.db = Database(engine, max_payload_bytes=max_payload_bytes, secrets=secrets)
        self._appender = make_turn_appender(self.db)
        self.runs = RunRepository(self.db)
        self.events = EventRepository(self.db, self.runs)
        self.sessions = SessionRepository(self.db, self.runs, self._appender)
        self.turns = TurnRepository(self.db, self.runs, self._appender)
        self.tasks = TaskRepository(self.db, self.runs)
        self.consumers = ConsumerRepository(self.db, self.runs)
        self.versions = VersionRepository(self.db, self.runs)
        self.artifacts = ArtifactRepository(self.db, self.runs, blobs)
        self.sandbox_checkpoints = SandboxCheckpointRepository(self.db, self.runs, blobs)

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        auto_upgrade: bool = True,
        pool_size: int = 5,
    ) -> EventStore:
        """Open the log at ``url`` (default: from settings), upgrading the schema if allowed."""
        settings = settings or load_settings()
        engine = make_engine(
            url or settings.resolved_database_url(),
            pool_size=pool_size,
            connect_timeout_s=settings.database_connect_timeout_s,
        )
        try:
            ensure_schema(engine, auto_upgrade=auto_upgrade)
        except OperationalError as e:
            raise StoreError(cannot_open("the database", engine.url, e.orig)) from e
        return cls(
            engine,
            blobs=LocalBlobStore(settings.resolved_artifacts_dir()),
            max_payload_bytes=settings.max_payload_bytes,
            secrets=tuple(s.get_secret_value() for s in settings.secrets),
        )

    def close(self) -> None:
        """Release the turn appender's connections and threads, then pooled connections."""
        self._appender.close()
        self.db.close()
