"""The store contract, run unchanged on SQLite and PostgreSQL (fixture ``store``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psycopg
import pytest
from sqlalchemy import text

from dressage.config import Settings
from dressage.errors import (
    IdempotencyConflictError,
    InvalidRecordError,
    LeaseError,
    UnknownRunError,
    UnknownSessionError,
)
from dressage.store import AppendResult, EventStore, NewTurn, TaskSpec
from dressage.store.turn_appenders import PostgresTurnAppender


def _turn(session_id: str, i: int, n_ctx: int = 3, n_gen: int = 4, version: int = 0, **kw: object) -> NewTurn:
    rng = np.random.default_rng(i)
    return NewTurn(
        session_id=session_id,
        turn_index=i,
        context_ids=rng.integers(0, 248_000, n_ctx),
        generated_ids=rng.integers(0, 248_000, n_gen),
        logprobs=-rng.random(n_gen).astype(np.float32),
        policy_versions=[version] * n_gen,
        **kw,  # type: ignore[arg-type]
    )


def test_run_create_continue_and_frozen_config(store: EventStore, run_name: str) -> None:
    run = store.runs.create(run_name, {"model": "tiny", "seed": 1})
    again = store.runs.create(run_name, {"model": "tiny", "seed": 1})
    assert again.id == run.id and again.config == {"model": "tiny", "seed": 1}
    assert store.runs.create(run_name).id == run.id  # continue without a config
    with pytest.raises(InvalidRecordError, match="different config"):
        store.runs.create(run_name, {"model": "tiny", "seed": 2})
    with pytest.raises(UnknownRunError):
        store.runs.get(run_name + "-missing")
    assert run_name in [r.name for r in store.runs.list()]


def test_turn_roundtrip_exact(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name, agent="a", sandbox="bwrap")
    experts = np.random.default_rng(0).integers(0, 8, (6, 2, 2)).astype(np.uint8)
    rec = _turn(s.id, 0, routed_experts=experts, finish_reason="stop", sampling_params={"temperature": 1.0})
    rec.loss_mask = [True, False, True, True]
    res = store.turns.append(run_name, rec)
    assert not res.duplicate
    [turn] = store.turns.read(run_name)
    assert turn.position == res.position
    np.testing.assert_array_equal(turn.context_ids, np.asarray(rec.context_ids, dtype=np.int32))
    np.testing.assert_array_equal(turn.generated_ids, np.asarray(rec.generated_ids, dtype=np.int32))
    np.testing.assert_array_equal(
        turn.logprobs, np.asarray(rec.logprobs, dtype=np.float32)
    )  # bit-exact float32
    np.testing.assert_array_equal(turn.loss_mask, [True, False, True, True])
    np.testing.assert_array_equal(turn.routed_experts, experts)
    assert turn.sampling_params == {"temperature": 1.0} and turn.finish_reason == "stop"


def test_positions_dense_and_idempotent(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    positions = [store.turns.append(run_name, _turn(s.id, i)).position for i in range(5)]
    retry = store.turns.append(run_name, _turn(s.id, 2))
    assert retry.duplicate and retry.position == positions[2]
    events = store.events.read(run_name)
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert store.events.last_position(run_name) == len(events)
    assert [e.position for e in store.events.read(run_name, after=positions[1], limit=2)] == positions[2:4]
    assert [e.position for e in store.events.tail(run_name, after=0)] == list(range(1, len(events) + 1))


def test_same_key_different_content_raises_and_changes_nothing(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    store.turns.append(run_name, _turn(s.id, 0))
    before = store.events.last_position(run_name)
    changed = _turn(s.id, 0)
    changed.logprobs = np.asarray(changed.logprobs) - 0.5
    with pytest.raises(IdempotencyConflictError, match="different content"):
        store.turns.append(run_name, changed)
    assert store.events.last_position(run_name) == before
    k1 = store.events.append(run_name, "note", {"x": 1}, key="k1")
    assert store.events.append(run_name, "note", {"x": 1}, key="k1") == k1.__class__(k1.position, "k1", True)
    with pytest.raises(IdempotencyConflictError):
        store.events.append(run_name, "note", {"x": 2}, key="k1")


def test_a_turn_index_is_recorded_once_per_session(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    first = store.turns.append(run_name, _turn(s.id, 0))
    before = store.events.last_position(run_name)
    other_key = _turn(s.id, 0, key="another-key-for-turn-0")
    with pytest.raises(InvalidRecordError, match="already has a turn 0 recorded under another key"):
        store.turns.append(run_name, other_key)
    assert store.events.last_position(run_name) == before
    assert [t.id for t in store.turns.read(run_name)] == [first.key]
    assert store.turns.append(run_name, _turn(s.id, 1)).position == before + 1  # the log goes on, dense


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"logprobs": [-0.1, -0.2]}, "logprobs has 2 entries"),
        ({"policy_versions": [0]}, "policy_versions has 1"),
        ({"loss_mask": [True] * 5}, "loss_mask has 5"),
        ({"context_ids": [[1, 2]]}, "one-dimensional"),
        ({"generated_ids": [1.5, 2, 3, 4]}, "integers"),
        ({"context_ids": [-1]}, "non-negative"),
        ({"logprobs": [float("nan"), -1, -1, -1]}, "NaN"),
        ({"logprobs": [0.5, -1, -1, -1]}, "<= 0"),
        ({"route": "teleport"}, "route must be"),
        ({"boundary_reason": "bad\udc80"}, "invalid UTF-8"),
        ({"finish_reason": "a\x00b"}, "NUL"),
        ({"info": {"note": "x" * (5 * 1024 * 1024)}}, "over the limit"),
        ({"info": {"bad": "\ud800"}}, "invalid UTF-8"),
        ({"sampling_params": {"t": float("inf")}}, "not valid JSON"),
        ({"routed_experts": np.zeros((2, 2), np.uint8)}, "tokens, layers, top_k"),
    ],
)
def test_bad_turns_are_refused_and_log_unchanged(
    store: EventStore, run_name: str, change: dict, match: str
) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    before = store.events.last_position(run_name)
    rec = _turn(s.id, 0)
    for k, v in change.items():
        setattr(rec, k, v)
    with pytest.raises(InvalidRecordError, match=match):
        store.turns.append(run_name, rec)
    assert store.events.last_position(run_name) == before
    assert store.turns.read(run_name) == []


def test_unknown_run_or_session_and_finished_session(store: EventStore, run_name: str) -> None:
    with pytest.raises(UnknownRunError):
        store.turns.append(run_name, _turn("nope", 0))
    store.runs.create(run_name)
    with pytest.raises(UnknownSessionError):
        store.turns.append(run_name, _turn("nope", 0))
    s = store.sessions.open(run_name)
    store.sessions.finalize(s.id, "finished", reward=0.5)
    with pytest.raises(InvalidRecordError, match="finished"):
        store.turns.append(run_name, _turn(s.id, 0))
    other = store.runs.create(run_name + "-other")
    with pytest.raises(InvalidRecordError, match="another run"):
        store.turns.append(other, _turn(s.id, 0))
    assert store.turns.read(run_name) == [] and store.turns.read(other) == []


def test_appending_to_a_dropped_run_records_nothing(store: EventStore, run_name: str) -> None:
    run = store.runs.create(run_name)
    s = store.sessions.open(run)
    store.turns.append(run, _turn(s.id, 0))
    store.runs.drop(run_name)
    with pytest.raises(UnknownSessionError):  # the stale Run object still names the dropped run
        store.turns.append(run, _turn(s.id, 1))
    with pytest.raises(UnknownRunError):
        store.runs.get(run_name)


def test_session_lifecycle_is_idempotent(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name, session_id="s-1", token="secret-token-123", agent="answer")
    assert store.sessions.open(run_name, session_id="s-1", agent="answer").id == "s-1"
    with pytest.raises(IdempotencyConflictError):
        store.sessions.open(run_name, session_id="s-1", agent="other")
    assert store.sessions.by_token("secret-token-123").id == "s-1"
    assert store.sessions.by_token("other") is None
    done = store.sessions.finalize(s.id, "finished", reward=1.0, finish_reason="stop")
    assert done.status == "finished" and done.reward == 1.0
    assert store.sessions.finalize(s.id, "finished", reward=1.0).status == "finished"
    with pytest.raises(IdempotencyConflictError):
        store.sessions.finalize(s.id, "failed", reward=0.0)
    kinds = [e.kind for e in store.events.read(run_name)]
    assert kinds.count("session_started") == 1 and kinds.count("session_finalized") == 1
    with pytest.raises(InvalidRecordError):
        store.sessions.finalize(s.id, "done")


def test_errors_are_redacted(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    done = store.sessions.finalize(
        s.id, "failed", error="agent crashed: Authorization: Bearer abcdefghijklmnop sk-abcdefghijklmnopqrstu"
    )
    assert "abcdefghijklmnop" not in done.error and "sk-abc" not in done.error and "[REDACTED]" in done.error


def test_task_leases(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    assert (
        store.tasks.enqueue(
            run_name, [TaskSpec(0, {"prompt": "a"}), TaskSpec(1, {"prompt": "b"})], n_samples=2
        )
        == 4
    )
    assert store.tasks.enqueue(run_name, [TaskSpec(0, {"prompt": "a"})], n_samples=2) == 0
    first = store.tasks.claim(run_name, "w1", n=3, lease_s=60)
    assert [(x.task_index, x.sample_index) for x in first] == [(0, 0), (0, 1), (1, 0)]
    second = store.tasks.claim(run_name, "w2", n=3, lease_s=60)
    assert [(x.task_index, x.sample_index) for x in second] == [(1, 1)]
    assert store.tasks.claim(run_name, "w3", n=1) == []
    renewed = store.tasks.renew(first[0], lease_s=120)
    assert renewed.expires_at > first[0].expires_at
    assert store.tasks.release(first[0], "done") == "done"
    with pytest.raises(LeaseError):
        store.tasks.release(first[0], "done")
    with pytest.raises(LeaseError):
        store.tasks.renew(first[0])
    assert store.tasks.release(first[1], "retry", max_attempts=3) == "pending"
    again = store.tasks.claim(run_name, "w2", n=1)
    assert again[0].task_id == first[1].task_id and again[0].attempt == 2
    assert store.tasks.counts(run_name)["done"] == 1


def test_expired_lease_abandons_running_session(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    store.tasks.enqueue(run_name, [TaskSpec(0, {})], n_samples=1)
    [lease] = store.tasks.claim(run_name, "crashed", lease_s=-1)  # already expired
    s = store.sessions.open(run_name, task_id=lease.task_id, attempt=lease.attempt)
    store.turns.append(run_name, _turn(s.id, 0))
    [retry] = store.tasks.claim(run_name, "w2", lease_s=60)
    assert retry.attempt == 2
    assert store.sessions.get(s.id).status == "abandoned"
    with pytest.raises(LeaseError):
        store.tasks.release(lease, "done")
    with pytest.raises(IdempotencyConflictError):
        store.sessions.finalize(s.id, "finished", reward=1.0)
    assert store.sessions.get(s.id).finish_reason == "lease_expired"


def test_max_attempts_fails_task(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    store.tasks.enqueue(run_name, [TaskSpec(0, {})])
    [lease] = store.tasks.claim(run_name, "w")
    assert store.tasks.release(lease, "retry", max_attempts=1) == "failed"
    assert store.tasks.claim(run_name, "w") == []


def test_consumer_steps_exactly_once(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    assert store.consumers.checkpoint(run_name, "train:main") is None
    store.consumers.commit_step(
        run_name, "train:main", step=1, position=5, batch_hash="h1", manifest={"samples": [1]}
    )
    again = store.consumers.commit_step(
        run_name, "train:main", step=1, position=5, batch_hash="h1", manifest={"samples": [1]}
    )
    assert again.step == 1
    with pytest.raises(IdempotencyConflictError, match="not deterministic"):
        store.consumers.commit_step(run_name, "train:main", step=1, position=5, batch_hash="h2", manifest={})
    with pytest.raises(InvalidRecordError, match="next step must be 2"):
        store.consumers.commit_step(run_name, "train:main", step=3, position=9, batch_hash="h3", manifest={})
    store.consumers.commit_step(
        run_name, "train:main", step=2, position=9, batch_hash="h2", manifest={}, state={"lr": 1}
    )
    cp = store.consumers.checkpoint(run_name, "train:main")
    assert (cp.step, cp.position, cp.state) == (2, 9, {"lr": 1})
    assert [s.batch_hash for s in store.consumers.steps(run_name, "train:main")] == ["h1", "h2"]


def test_artifacts_and_policy_versions(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    ref = store.artifacts.put(run_name, b"workspace bytes", name="workspace.tar.gz", session_id=s.id)
    same = store.artifacts.put(run_name, b"workspace bytes", name="workspace.tar.gz", session_id=s.id)
    assert same.id == ref.id and ref.size == 15
    assert store.artifacts.get(ref) == b"workspace bytes"
    assert [a.sha256 for a in store.artifacts.list(run_name, session_id=s.id)] == [ref.sha256]
    assert store.versions.latest(run_name) is None
    p1 = store.versions.record(run_name, 1, "file:///ckpt/1")
    assert store.versions.record(run_name, 1, "file:///ckpt/1").position == p1.position
    store.versions.record(run_name, 2)
    assert store.versions.latest(run_name) == 2


def test_views(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    store.turns.append(run_name, _turn(s.id, 0, n_ctx=3, n_gen=2, version=4))
    store.turns.append(run_name, _turn(s.id, 1, n_ctx=2, n_gen=3, version=5, segment_offset=5))
    store.sessions.finalize(s.id, "finished", reward=0.25)
    with store.db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT turn_index, position, token_id, logprob, loss_mask, policy_version FROM token_events "
                "WHERE run_name = :r ORDER BY position"
            ),
            {"r": run_name},
        ).all()
        traj = conn.execute(text("SELECT * FROM trajectories WHERE run_name = :r"), {"r": run_name}).one()
    assert [r.position for r in rows] == list(range(10))
    turns = store.turns.read(run_name)
    expected = np.concatenate([np.concatenate([t.context_ids, t.generated_ids]) for t in turns])
    assert [r.token_id for r in rows] == expected.tolist()
    assert [bool(r.loss_mask) for r in rows] == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 3
    assert all(r.logprob is None for r in rows if not r.loss_mask)
    np.testing.assert_allclose(
        [r.logprob for r in rows if r.loss_mask], np.concatenate([t.logprobs for t in turns])
    )
    assert [r.policy_version for r in rows if r.loss_mask] == [4, 4, 5, 5, 5]
    assert (traj.n_turns, traj.n_segments, traj.n_tokens, traj.n_trained_tokens) == (2, 1, 10, 5)
    assert traj.status == "finished" and traj.reward == 0.25


def test_reads_rebuild_the_constant_mask_and_versions_exactly(store: EventStore, run_name: str) -> None:
    # Reads skip a loss mask that is all true and versions that are one value; the rest come as stored.
    store.runs.create(run_name)
    s = store.sessions.open(run_name)
    cases = [
        {"loss_mask": None, "policy_versions": [7, 7, 7, 7]},  # both skipped by the read
        {"loss_mask": [True, False, True, True], "policy_versions": [3, 3, 4, 4]},  # both read
        {"loss_mask": [False] * 4, "policy_versions": [0, 0, 0, 0]},  # nothing trained: the mask is read
    ]
    for i, kw in enumerate(cases):
        rec = _turn(s.id, i)
        rec.loss_mask, rec.policy_versions = kw["loss_mask"], kw["policy_versions"]
        store.turns.append(run_name, rec)
    empty = _turn(s.id, 3, n_ctx=2, n_gen=0)
    store.turns.append(run_name, empty)
    turns = store.turns.read(run_name)
    for turn, kw in zip(turns, cases, strict=False):
        mask = [True] * 4 if kw["loss_mask"] is None else kw["loss_mask"]
        assert turn.loss_mask.dtype == np.bool_ and turn.loss_mask.tolist() == mask
        assert (
            turn.policy_versions.dtype == np.int32 and turn.policy_versions.tolist() == kw["policy_versions"]
        )
    assert turns[3].generated_ids.size == turns[3].loss_mask.size == turns[3].policy_versions.size == 0
    arrays = store.turns.read_token_arrays(run_name)
    generated = arrays["logprobs"] == arrays["logprobs"]  # not NaN: the generated tokens
    assert arrays["loss_mask"][generated].tolist() == [True] * 4 + [True, False, True, True] + [False] * 4
    assert arrays["policy_versions"][generated].tolist() == [7] * 4 + [3, 3, 4, 4] + [0] * 4
    assert (arrays["policy_versions"][~generated] == -1).all() and arrays["token_ids"].size == 3 * 7 + 2


def test_read_token_arrays_and_drop(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    other = store.runs.create(run_name + "-other")
    s = store.sessions.open(run_name)
    o = store.sessions.open(other)
    for i in range(3):
        store.turns.append(run_name, _turn(s.id, i))
    store.turns.append(other, _turn(o.id, 0))
    arrays = store.turns.read_token_arrays(run_name)
    assert arrays["token_ids"].size == 21 and arrays["loss_mask"].sum() == 12
    assert arrays["turn_offsets"].tolist() == [0, 7, 14, 21]
    store.runs.drop(run_name)
    with pytest.raises(UnknownRunError):
        store.runs.get(run_name)
    assert len(store.turns.read(other)) == 1


def test_append_turn_async_matches_the_sync_contract(store: EventStore, run_name: str) -> None:
    import asyncio

    store.runs.create(run_name)
    s = store.sessions.open(run_name)

    async def go() -> list[object]:
        first = await store.turns.append_async(run_name, _turn(s.id, 0))
        again = await store.turns.append_async(run_name, _turn(s.id, 0))
        concurrent = await asyncio.gather(
            *(store.turns.append_async(run_name, _turn(s.id, i)) for i in range(1, 6))
        )
        changed = _turn(s.id, 1)
        changed.logprobs = np.asarray(changed.logprobs) - 0.5
        with pytest.raises(IdempotencyConflictError):
            await store.turns.append_async(run_name, changed)
        with pytest.raises(UnknownSessionError):
            await store.turns.append_async(run_name, _turn("nope", 0))
        await store.turns.aclose_async()
        return [first, again, *concurrent]

    first, again, *rest = asyncio.run(go())
    assert again.duplicate and again.position == first.position
    positions = sorted([first.position, *(r.position for r in rest)])
    assert positions == list(range(positions[0], positions[0] + 6)), "dense positions"
    assert [t.turn_index for t in store.turns.read(run_name)] == list(range(6))


def test_postgresql_append_survives_a_dropped_connection(pg_url: str, tmp_path: Path, run_name: str) -> None:
    """The server ends the appender's backend (restart, failover, idle timeout): the next append
    reconnects, re-prepares and lands; a re-send of it is recognised as the same turn."""
    store = EventStore.open(
        settings=Settings(database_url=pg_url, home=tmp_path / "home"), auto_upgrade=False
    )
    try:
        store.runs.create(run_name)
        s = store.sessions.open(run_name)
        first = store.turns.append(run_name, _turn(s.id, 0))
        appender = store.turns.appender
        assert isinstance(appender, PostgresTurnAppender)
        pid = appender._thread_appender()._conn.info.backend_pid  # type: ignore[union-attr]
        admin = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        second = store.turns.append(run_name, _turn(s.id, 1))
        assert (second.position, second.duplicate) == (first.position + 1, False)
        assert store.turns.append(run_name, _turn(s.id, 1)) == AppendResult(second.position, second.key, True)
        assert [t.turn_index for t in store.turns.read(run_name)] == [0, 1]
    finally:
        store.close()


def test_postgresql_async_append_survives_a_dropped_connection(
    pg_url: str, tmp_path: Path, run_name: str
) -> None:
    """The same for the proxy's async appenders: the broken connection is replaced, nothing is lost."""
    import asyncio

    store = EventStore.open(
        settings=Settings(database_url=pg_url, home=tmp_path / "home"), auto_upgrade=False
    )
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        store.runs.create(run_name)
        s = store.sessions.open(run_name)

        async def go() -> tuple[AppendResult, AppendResult, AppendResult]:
            first = await store.turns.append_async(run_name, _turn(s.id, 0))
            appender = store.turns.appender
            assert isinstance(appender, PostgresTurnAppender)
            pool = appender._pools[asyncio.get_running_loop()]
            pids = [a._conn.info.backend_pid for a in pool._all if a._conn is not None]
            assert pids, "the first append opened an async connection"
            with psycopg.connect(admin, autocommit=True) as conn:  # end every async appender's backend
                conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
            second = await store.turns.append_async(run_name, _turn(s.id, 1))
            again = await store.turns.append_async(run_name, _turn(s.id, 1))
            await store.turns.aclose_async()
            return first, second, again

        first, second, again = asyncio.run(go())
        assert (second.position, second.duplicate) == (first.position + 1, False)
        assert again == AppendResult(second.position, second.key, True)
        assert [t.turn_index for t in store.turns.read(run_name)] == [0, 1]
    finally:
        store.close()


def test_resuming_claim_keeps_the_session_for_the_next_attempt(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    store.tasks.enqueue(run_name, [TaskSpec(0, {})], n_samples=1)
    [lease] = store.tasks.claim(run_name, "crashed", lease_s=-1, resume=True)
    s = store.sessions.open(run_name, task_id=lease.task_id, attempt=lease.attempt, token="sk-old")
    store.turns.append(run_name, _turn(s.id, 0))
    [retry] = store.tasks.claim(run_name, "w2", lease_s=-1, resume=True, max_attempts=3)
    assert retry.attempt == 2 and store.sessions.get(s.id).status == "running"
    found = store.sessions.interrupted(retry.task_id, retry.attempt)
    assert found is not None and found.id == s.id
    store.sessions.take_over(s.id, attempt=retry.attempt, token="sk-new")
    assert store.sessions.by_token("sk-old") is None
    taken = store.sessions.by_token("sk-new")
    assert taken is not None and taken.attempt == 2
    assert taken.info["resume"] == {
        "attempt": 2,
        "from_attempt": 1,
        "seed_attempt": 1,
        "next_turn": 1,
        "count": 1,
    }
    assert store.sessions.interrupted(retry.task_id, 2) is None  # it belongs to attempt 2 now
    with pytest.raises(LeaseError):  # the stalled first attempt cannot finalize it
        store.sessions.finalize(s.id, "finished", reward=1.0, attempt=1)
    # The last attempt expires too: no attempt is left, so this claim abandons the session.
    assert store.tasks.claim(run_name, "w3", resume=True, max_attempts=2) == []
    final = store.sessions.get(s.id)
    assert final.status == "abandoned" and final.finish_reason == "lease_expired"
    assert store.tasks.counts(run_name)["failed"] == 1


def test_a_handed_back_lease_is_claimable_at_once_and_its_session_taken_over(
    store: EventStore, run_name: str
) -> None:
    store.runs.create(run_name)
    store.tasks.enqueue(run_name, [TaskSpec(0, {})], n_samples=1)
    [lease] = store.tasks.claim(run_name, "stopping", lease_s=3600, resume=True)
    s = store.sessions.open(run_name, task_id=lease.task_id, attempt=lease.attempt)
    store.turns.append(run_name, _turn(s.id, 0))
    assert store.tasks.claim(run_name, "other", resume=True) == []  # held for an hour
    assert store.tasks.hand_back(lease) is True
    assert store.tasks.hand_back(lease) is True  # still this owner's (expired) lease: harmless again
    [handed] = store.events.read(run_name, kinds=("task_handed_back",))
    assert handed.payload == {"task_id": lease.task_id, "attempt": 1, "owner": "stopping"}
    [retry] = store.tasks.claim(run_name, "other", resume=True, max_attempts=3)
    assert retry.attempt == 2 and store.sessions.get(s.id).status == "running"
    found = store.sessions.interrupted(retry.task_id, retry.attempt)
    assert found is not None and found.id == s.id
    assert store.tasks.hand_back(lease) is False  # no longer held by "stopping": nothing happens
    with pytest.raises(LeaseError):
        store.tasks.release(lease, "done")


def test_requeue_failed_tells_infrastructure_from_agent_failures(store: EventStore, run_name: str) -> None:
    store.runs.create(run_name)
    store.tasks.enqueue(run_name, [TaskSpec(0, {}), TaskSpec(1, {})], n_samples=1)
    agent, infra = store.tasks.claim(run_name, "w1", n=2, lease_s=-1)
    # Task 0: its agent failed on the last attempt (session failed, released as failed).
    s = store.sessions.open(run_name, task_id=agent.task_id, attempt=agent.attempt)
    store.sessions.finalize(s.id, "failed", finish_reason="agent_crashed", error="boom")
    assert store.tasks.release(agent, "retry", max_attempts=1) == "failed"
    # Task 1: its worker died on the last attempt (the lease expired): infrastructure.
    store.sessions.open(run_name, task_id=infra.task_id, attempt=infra.attempt)
    assert store.tasks.claim(run_name, "w2", max_attempts=1) == []
    assert store.tasks.counts(run_name)["failed"] == 2

    plain = store.tasks.requeue_failed(run_name)
    assert (plain.infrastructure, plain.agent, plain.agent_left) == (1, 0, 1)
    [again] = store.tasks.claim(run_name, "w3", max_attempts=1)  # one more attempt despite max_attempts
    assert (again.task_id, again.attempt) == (infra.task_id, 2)
    assert store.tasks.release(again, "retry", max_attempts=1) == "failed"  # a failure there counts

    both = store.tasks.requeue_failed(run_name, agent_failures=True)
    assert (both.infrastructure, both.agent, both.agent_left) == (1, 1, 0)
    assert store.tasks.counts(run_name) == {"pending": 2, "leased": 0, "done": 0, "failed": 0}
    requeued = store.events.read(run_name, kinds=("tasks_requeued",))
    assert [e.payload["task_ids"] for e in requeued] == [
        [infra.task_id],
        sorted([agent.task_id, infra.task_id]),
    ]
