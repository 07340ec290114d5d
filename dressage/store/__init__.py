"""The event log: schema, append/read protocols, leases, consumers, artifacts, views."""

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
    "Event",
    "EventStore",
    "NewTurn",
    "Run",
    "RunSummary",
    "Session",
    "TaskLease",
    "TaskSpec",
    "TaskState",
    "TrainStep",
    "Turn",
    "deterministic_key",
    "turn_key",
]
