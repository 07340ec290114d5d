"""The log's integrity refusals say which field and why, in the log's words, never the driver's text.

A foreign-key, unique or NOT NULL violation's text names tables and constraints (PostgreSQL) or is
a bare "FOREIGN KEY constraint failed" (SQLite); such text reached admin answers and command output.
"""

from __future__ import annotations

import pytest

from dressage.errors import InvalidRecordError
from dressage.store import EventStore
from dressage.store.records import TaskSpec

SQL_WORDS = ("constraint", "fk_", "uq_", "insert", "table", "sessions", "events", "[sql", "violates")


def _no_sql(message: str) -> None:
    lowered = message.lower()
    assert not [w for w in SQL_WORDS if w in lowered], message


def test_a_session_of_a_task_outside_its_run_is_refused_naming_task_id(
    store: EventStore, run_name: str
) -> None:
    store.runs.create(run_name, {})
    other = store.runs.create(f"{run_name}-other", {})
    store.tasks.enqueue(other, [TaskSpec(0, {"prompt": "p"})], n_samples=1)
    [foreign] = store.tasks.claim(other, "w", lease_s=60)
    for task_id in (987_654_321, foreign.task_id):
        with pytest.raises(InvalidRecordError) as e:
            store.sessions.open(run_name, task_id=task_id, agent="a")
        assert (
            e.value.field == "task_id"
            and str(e.value) == f"task_id {task_id} is not a task of run {run_name!r}"
        )
    assert store.sessions.list(run_name) == []


def test_a_foreign_key_refusal_names_the_field_not_the_sql(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name, {})
    with pytest.raises(InvalidRecordError) as e:
        store.artifacts.put(run_name, b"x", name="note.txt", session_id="no-such-session")
    _no_sql(str(e.value))
    assert "refers to a row the log does not hold (a foreign key)" in str(e.value)
    if store.db.dialect == "postgresql":  # SQLite does not say which column it refused
        assert e.value.field == "session_id" and "field 'session_id'" in str(e.value)
