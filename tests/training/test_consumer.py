"""The trainer as a log consumer on SQLite and PostgreSQL: readiness, policies, commit, replay."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from dressage.errors import ReplayDriftError
from dressage.store import EventStore
from dressage.training import MaskingPolicy, StepOptions, Trainer
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, build_run, simple


def test_steps_broadcast_and_replay(store: EventStore, run_name: str) -> None:
    sub = TrajSpec(
        1.0,
        [SegmentSpec(0, [TurnSpec(4, 3), TurnSpec(2, 3)]), SegmentSpec(1, [TurnSpec(5, 2)], "subagent")],
        order=[(0, 0), (1, 0), (0, 1)],
    )
    build_run(store, run_name, [[sub, simple(0.0)], [simple(2.0), simple(0.0)], [simple(1.0), simple(1.0)]])
    trainer = Trainer(store, run_name, StepOptions(global_batch_size=2, n_samples_per_prompt=2))
    results = trainer.run_steps()
    assert [r.batch.step for r in results] == [1, 2, 3]
    first = results[0].batch
    assert [
        (s.session_id.split("-", 2)[-1], s.segment_index, s.is_anchor, s.advantage) for s in first.samples
    ] == [
        ("t0-s0-a1", 0, True, 0.5),
        ("t0-s0-a1", 1, False, 0.5),
        ("t0-s1-a1", 0, True, -0.5),
    ]
    assert first.samples[0].rollout_routed_experts.shape == (len(first.samples[0].tokens) - 1, 2, 2)
    assert sum(float(s.loss_weights.sum()) for s in first.samples) == pytest.approx(1.0)
    steps = store.consumers.steps(run_name, "train:main")
    assert [s.batch_hash for s in steps] == [r.batch.batch_hash for r in results]
    assert store.consumers.checkpoint(run_name, "train:main").step == 3
    assert trainer.run_steps() == []  # nothing new
    assert len(Trainer(store, run_name, StepOptions(2, 2)).replay()) == 3

    # tamper with one stored logprob of the second group's first session: replay names it
    sid = f"{run_name}-t1-s0-a1"
    with store.db.engine.begin() as conn:
        row = conn.execute(
            text("SELECT id, logprobs FROM turns WHERE session_id = :s ORDER BY turn_index"), {"s": sid}
        ).first()
        lps = list(row.logprobs) if store.db.dialect == "postgresql" else json.loads(row.logprobs)
        lps[0] = -9.5
        value = lps if store.db.dialect == "postgresql" else json.dumps(lps)
        conn.execute(text("UPDATE turns SET logprobs = :v WHERE id = :i"), {"v": value, "i": row.id})
    with pytest.raises(
        ReplayDriftError, match=rf"step 2 .*sample 0 \(session {sid} segment 0\): field rollout_log_probs"
    ):
        Trainer(store, run_name, StepOptions(2, 2)).replay()


def test_retry_counts_the_finished_attempt_and_failure_policies(store: EventStore, run_name: str) -> None:
    failed = TrajSpec(0.0, [SegmentSpec(0, [TurnSpec(3, 2)])], status="failed")
    build_run(
        store,
        run_name,
        [
            [[failed, simple(1.0)], simple(0.0)],  # failed then finished retry: a complete group
            [failed, simple(1.0)],  # a member that never finished
            [simple(3.0), simple(1.0)],
        ],
    )
    drop = Trainer(store, run_name, StepOptions(2, 2), consumer="drop").run_steps()
    assert len(drop) == 2
    assert drop[0].batch.samples[0].session_id.endswith("t0-s0-a2")
    decisions = drop[1].batch.manifest["groups"]
    assert [(g["task_index"], g["kept"], g.get("reason")) for g in decisions] == [
        (1, False, "member_not_finished"),
        (2, True, None),
    ]
    keep = Trainer(
        store,
        run_name,
        StepOptions(2, 2, masking=MaskingPolicy(failure_policy="keep_finished")),
        consumer="keep",
    ).run_steps()
    assert len(keep) == 3
    assert keep[1].batch.manifest["groups"][0]["dropped_members"] == [0]
    assert [s.advantage for s in keep[1].batch.samples] == [0.0]


def test_version_window_and_staleness_are_recorded(store: EventStore, run_name: str) -> None:
    # a turn that spans a weight push (versions 2, 3, 3), then a turn at version 3
    spanning = TrajSpec(1.0, [SegmentSpec(0, [TurnSpec(4, 3, versions=[2, 3, 3]), TurnSpec(4, 3, 3)])])
    build_run(store, run_name, [[simple(1.0, version=0), simple(0.0, version=0)], [spanning, simple(0.0, 2)]])
    opts = StepOptions(
        2,
        2,
        initial_version=3,
        masking=MaskingPolicy(max_staleness=0, group_version_window=2, staleness_reference="trainer"),
    )
    results = Trainer(store, run_name, opts).run_steps()
    assert len(results) == 1
    groups = results[0].batch.manifest["groups"]
    assert groups[0]["reason"] == "outside_version_window" and groups[0]["oldest_version"] == 0
    assert groups[1]["kept"] is True
    # trainer version 3, max_staleness 0: every version-2 token is masked, version 3 trains
    assert [s.n_trainable for s in results[0].batch.samples] == [5, 0]
    entries = results[0].batch.manifest["samples"]
    assert [e["versions"] for e in entries] == [{"2": 1, "3": 5}, {"2": 6}]
    assert [e["masking"] for e in entries] == [
        {"recorded_trainable": 6, "masked_stale": 1, "trainable": 5},
        {"recorded_trainable": 6, "masked_stale": 6, "trainable": 0},
    ]
    # the recorded manifest (not only the in-memory batch) carries them
    assert store.consumers.steps(run_name, "train:main")[0].manifest["samples"] == entries
