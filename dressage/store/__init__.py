"""The event log: an :class:`EventStore` composed of a :class:`Database` and repositories (runs,
events, sessions, turns, tasks, consumers, versions, artifacts), the schema and the SQL views."""

from dressage.store.database import Database
from dressage.store.event_store import EventStore
from dressage.store.records import (
    AppendResult,
    ArtifactRef,
    ConsumerCheckpoint,
    Event,
    NewTurn,
    Run,
    RunSummary,
    Session,
    TaskLease,
    TaskPair,
    TaskSpec,
    TaskState,
    TrainStep,
    Turn,
    deterministic_key,
    turn_key,
)

__all__ = [
    "AppendResult",
    "ArtifactRef",
    "ConsumerCheckpoint",
    "Database",
    "Event",
    "EventStore",
    "NewTurn",
    "Run",
    "RunSummary",
    "Session",
    "TaskLease",
    "TaskPair",
    "TaskSpec",
    "TaskState",
    "TrainStep",
    "Turn",
    "deterministic_key",
    "turn_key",
]
