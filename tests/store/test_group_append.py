"""Group append on PostgreSQL: turns that arrive together go into one transaction (one flush).

Real PostgreSQL, real concurrency on one event loop (as the proxy appends). Checked: positions
stay dense and in commit order, every turn is recorded exactly once with its own tokens, a group
with a re-sent key, a conflicting one or a closed session answers each turn as a lone append
would (the failed group leaves no hole), and finalizes racing groups neither deadlock nor let a
turn land after its session's ``session_finalized``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Iterator

import numpy as np
import pytest
from sqlalchemy import text

from dressage.config import Settings
from dressage.errors import IdempotencyConflictError, InvalidRecordError
from dressage.store import EventStore, NewTurn
from dressage.store.pg_group_append import GroupAppender
from dressage.store.records import AppendResult
from tests.store.writer_proc import make_turn

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[EventStore]:
    store = EventStore.open(settings=Settings(database_url=pg_url), auto_upgrade=False)
    yield store
    store.close()


def _group(store: EventStore) -> GroupAppender:
    return store.turns.appender.group_appender()  # type: ignore[attr-defined]


def _positions(store: EventStore, run: str) -> list[int]:
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT position FROM events WHERE run_id = (SELECT id FROM runs WHERE name = :r) ORDER BY position"
            ),
            {"r": run},
        ).all()
    return [int(r[0]) for r in rows]


def _deadlocks(store: EventStore) -> int:
    """Deadlocks PostgreSQL detected (and broke) in this database so far."""
    with store.db.read() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


async def _held_together(
    store: EventStore, appends: list[Awaitable[AppendResult]]
) -> tuple[list[object], int, int]:
    """Run ``appends`` while a lone append is marked in flight, so they all queue for one group;
    their results (or errors), and the groups written and turns recorded in groups."""
    group = _group(store)
    async with group.alone():
        tasks = [asyncio.ensure_future(a) for a in appends]
        done, _ = await asyncio.wait(tasks, timeout=0.05)  # none may end while the lone append is in flight
        assert not done, "an append did not wait for the group"
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await store.turns.aclose_async()
    return results, group.groups, group.grouped_turns


def test_concurrent_appends_are_grouped_dense_and_exact(pg_store: EventStore) -> None:
    run = f"group-{uuid.uuid4().hex[:8]}"
    pg_store.runs.create(run)
    sessions = [pg_store.sessions.open(run).id for _ in range(12)]

    async def agent(sid: str) -> list[int]:
        return [(await pg_store.turns.append_async(run, make_turn(sid, i))).position for i in range(8)]

    async def main() -> tuple[list[list[int]], int, int]:
        acks = await asyncio.gather(*(agent(s) for s in sessions))
        group = _group(pg_store)
        counts = group.groups, group.grouped_turns
        await pg_store.turns.aclose_async()
        return acks, *counts

    acks, groups, grouped = asyncio.run(main())
    assert groups > 0 and grouped > len(sessions), "no turns were written together"
    positions = _positions(pg_store, run)
    assert positions == list(range(1, len(positions) + 1)), "positions are not dense"
    acked = sorted(p for a in acks for p in a)
    assert len(acked) == len(set(acked)) == 96
    for sid, session_acks in zip(sessions, acks, strict=True):
        assert session_acks == sorted(session_acks), "a session's turns are out of commit order"
        turns = pg_store.turns.read(session_id=sid)
        assert [t.turn_index for t in turns] == list(range(8))
        assert [t.position for t in turns] == session_acks
        for t in turns:
            want = make_turn(sid, t.turn_index)
            assert np.array_equal(t.generated_ids, np.asarray(want.generated_ids))
            assert np.array_equal(t.context_ids, np.asarray(want.context_ids))


def test_a_failed_group_answers_each_turn_as_alone_and_leaves_no_hole(pg_store: EventStore) -> None:
    run = f"group-{uuid.uuid4().hex[:8]}"
    pg_store.runs.create(run)
    a, b, c = (pg_store.sessions.open(run).id for _ in range(3))
    first = pg_store.turns.append(run, make_turn(a, 0))
    taken = make_turn(b, 0)
    pg_store.turns.append(run, taken)
    other = NewTurn(**{**taken.__dict__, "generated_ids": np.asarray(taken.generated_ids) + 1})

    results, groups, _ = asyncio.run(
        _held_together(
            pg_store,
            [
                pg_store.turns.append_async(run, make_turn(c, 0)),
                pg_store.turns.append_async(run, make_turn(a, 0)),  # re-sent: the stored position
                pg_store.turns.append_async(run, other),  # turn 0 of b again, other tokens: a conflict
                pg_store.turns.append_async(run, make_turn(c, 1)),
            ],
        )
    )
    fresh, resent, refused, fresh2 = results
    assert isinstance(resent, AppendResult) and resent.duplicate and resent.position == first.position
    assert isinstance(refused, IdempotencyConflictError)
    assert isinstance(fresh, AppendResult) and isinstance(fresh2, AppendResult)
    assert not fresh.duplicate and fresh2.position > fresh.position
    assert groups == 0, "a group with a re-sent key cannot commit"
    positions = _positions(pg_store, run)
    assert positions == list(range(1, len(positions) + 1)), "the rolled-back group left a hole"


def test_a_closed_session_in_a_group_is_refused_and_the_rest_recorded(pg_store: EventStore) -> None:
    run = f"group-{uuid.uuid4().hex[:8]}"
    pg_store.runs.create(run)
    a, closed, b = (pg_store.sessions.open(run).id for _ in range(3))
    pg_store.sessions.finalize(closed, "finished", reward=0.0)

    (ra, rclosed, rb), groups, grouped = asyncio.run(
        _held_together(
            pg_store,
            [
                pg_store.turns.append_async(run, make_turn(a, 0)),
                pg_store.turns.append_async(run, make_turn(closed, 0)),
                pg_store.turns.append_async(run, make_turn(b, 0)),
            ],
        )
    )
    assert (groups, grouped) == (1, 2)
    assert isinstance(rclosed, InvalidRecordError) and "finished" in str(rclosed)
    assert isinstance(ra, AppendResult) and isinstance(rb, AppendResult)
    assert rb.position == ra.position + 1
    assert pg_store.turns.read(session_id=closed) == []


def test_finalizes_racing_groups_neither_deadlock_nor_land_turns_after_them(pg_store: EventStore) -> None:
    run = f"group-{uuid.uuid4().hex[:8]}"
    pg_store.runs.create(run)
    sessions = [pg_store.sessions.open(run).id for _ in range(16)]
    failures: list[BaseException] = []

    def finalize_half() -> None:
        for sid in sessions[::2]:
            try:
                pg_store.sessions.finalize(sid, "finished", reward=1.0)
            except BaseException as e:  # a deadlock victim would land here
                failures.append(e)

    async def agent(sid: str) -> None:
        for i in range(12):
            try:
                await pg_store.turns.append_async(run, make_turn(sid, i))
            except InvalidRecordError:
                return  # finalized meanwhile: refused, as a lone append is

    async def main() -> int:
        finalizer = threading.Thread(target=finalize_half)
        agents = asyncio.gather(*(agent(s) for s in sessions))
        await asyncio.sleep(0.01)
        finalizer.start()
        await agents
        await asyncio.to_thread(finalizer.join)
        grouped = _group(pg_store).grouped_turns
        await pg_store.turns.aclose_async()
        return grouped

    deadlocks_before = _deadlocks(pg_store)
    grouped = asyncio.run(main())
    assert failures == []
    time.sleep(1.5)  # backends publish their statistics at most once a second
    assert _deadlocks(pg_store) == deadlocks_before, "PostgreSQL broke a deadlock"
    assert grouped > 0, "no turns were written together"
    with pg_store.db.read() as conn:
        late = conn.execute(
            text(
                "SELECT count(*) FROM events t JOIN events f ON f.session_id = t.session_id "
                "AND f.kind = 'session_finalized' AND t.kind = 'turn' AND t.position > f.position "
                "WHERE t.run_id = (SELECT id FROM runs WHERE name = :r)"
            ),
            {"r": run},
        ).scalar_one()
    assert late == 0, "a turn landed after its session's session_finalized"
    positions = _positions(pg_store, run)
    assert positions == list(range(1, len(positions) + 1))
    assert all(len(pg_store.turns.read(session_id=s)) == 12 for s in sessions[1::2])
