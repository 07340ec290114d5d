"""A run with everything an export must carry: tool calls, several segments and lineages, eval
sessions, routed experts (two dtypes), a failed session, an artifact and policy versions.

Built through the EventStore API (no mocks): 2 train tasks x 2 samples and 1 eval task x 2.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.store.db import upgrade
from tests.conftest import create_pg_database
from tests.stores import open_store
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, turn_records

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


@dataclass
class RichRun:
    """What was recorded: the run's name and every turn record by session."""

    run: str
    turns: dict[str, list[NewTurn]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    artifact: bytes = b"agent log \x00 bytes"


def _spec(kind: str, task: int, sample: int) -> TrajSpec:
    if kind == "eval":
        return TrajSpec(1.0 * sample, [SegmentSpec(0, [TurnSpec(3, 2), TurnSpec(2, 2)])], experts=False)
    if (task, sample) == (0, 0):  # a compaction: a second lineage, a second segment
        return TrajSpec(
            1.0,
            [
                SegmentSpec(0, [TurnSpec(4, 3), TurnSpec(2, 2, versions=[0, 1], mask=[True, False])]),
                SegmentSpec(1, [TurnSpec(5, 2, 1)], boundary_reason="new_conversation"),
            ],
        )
    if (task, sample) == (1, 1):
        return TrajSpec(0.0, [SegmentSpec(0, [TurnSpec(3, 1)])], status="failed")
    return TrajSpec(0.5 * sample, [SegmentSpec(0, [TurnSpec(4, 3), TurnSpec(3, 2), TurnSpec(2, 2)])])


def _with_tool_calls(records: list[NewTurn]) -> list[NewTurn]:
    """Every turn but the last asks for a tool; the tools and the calls are recorded with them."""
    out = []
    for i, rec in enumerate(records):
        last = i == len(records) - 1
        info = {} if last else {"tool_calls": [{"name": "run", "arguments": {"cmd": f"ls {i}"}}]}
        out.append(
            dataclasses.replace(
                rec,
                finish_reason="stop" if last else "tool_calls",
                sampling_params={"temperature": 1.0, "tools": TOOLS},
                info=info,
                latency_ms=1.5 * (i + 1),
            )
        )
    return out


def build_rich_run(store: EventStore, run: str) -> RichRun:
    """Record the run of the module docstring."""
    rr = RichRun(run)
    rng = np.random.default_rng(3)
    store.runs.create(run, {"model": "tiny", "seed": 3})
    store.versions.record(run, 0)
    store.versions.record(run, 1, "file:///ckpt/1")
    store.tasks.enqueue(run, [TaskSpec(0, {"prompt": "a"}), TaskSpec(1, {"prompt": "b"})], n_samples=2)
    store.tasks.enqueue(run, [TaskSpec(0, {"prompt": "held out"})], n_samples=2, eval_version=0)
    while leases := store.tasks.claim(run, "test-worker", n=1):
        lease = leases[0]
        sid = f"{run}-{lease.kind}-t{lease.task_index}-s{lease.sample_index}"
        spec = _spec(lease.kind, lease.task_index, lease.sample_index)
        store.sessions.open(run, session_id=sid, task_id=lease.task_id, attempt=lease.attempt, agent="python")
        records = _with_tool_calls(turn_records(sid, spec, rng))
        if lease.kind == "train" and lease.task_index == 0 and lease.sample_index == 1:
            # experts needing int16 (ids above 255)
            records[0] = dataclasses.replace(
                records[0],
                routed_experts=rng.integers(200, 4000, records[0].routed_experts.shape).astype(np.int16),
            )
        for rec in records:
            store.turns.append(run, rec)
        reward = spec.reward if spec.status == "finished" else None
        store.sessions.finalize(sid, spec.status, reward=reward, finish_reason="stop")
        store.tasks.release(lease, "done" if spec.status == "finished" else "failed")
        rr.turns[sid], rr.status[sid], rr.kind[sid] = records, spec.status, lease.kind
    first = next(iter(rr.turns))
    store.artifacts.put(run, rr.artifact, name="agent.log", session_id=first)
    return rr


@pytest.fixture
def rich_run(store: EventStore, run_name: str) -> RichRun:
    """The rich run in this test's store (SQLite or PostgreSQL)."""
    return build_rich_run(store, run_name)


@pytest.fixture
def other_url(db_url: str, tmp_path: Path) -> str:
    """A second, empty log on the same backend."""
    if db_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'other.db'}"
        upgrade(url)
        return url
    return create_pg_database(f"datasets_import_{os.getpid()}")


@pytest.fixture
def other(other_url: str, tmp_path: Path) -> Iterator[EventStore]:
    with open_store(other_url, tmp_path / "home2") as s:
        yield s
