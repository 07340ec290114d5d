"""Steps formed with turns read ahead (:mod:`dressage.training.turn_prefetch`) are the steps formed
from turns read group by group, on both backends; on PostgreSQL the next step is read ahead."""

from __future__ import annotations

from dressage.store import EventStore
from dressage.training import StepOptions
from dressage.training.groups import START_CURSOR, GroupTracker
from dressage.training.manifest import batch_hash
from dressage.training.steps import StepBuilder
from dressage.training.weights import assign_loss_weights
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, build_run, simple


def test_read_ahead_steps_equal_steps_read_group_by_group(store: EventStore, run_name: str) -> None:
    branchy = TrajSpec(
        1.0,
        [SegmentSpec(0, [TurnSpec(4, 3), TurnSpec(2, 5)]), SegmentSpec(1, [TurnSpec(5, 2)], "subagent")],
        order=[(0, 0), (1, 0), (0, 1)],
    )
    failed = TrajSpec(0.0, [SegmentSpec(0, [TurnSpec(3, 2)])], status="failed")
    groups = [[branchy, simple(0.0)], [simple(2.0), [failed, simple(1.0)]], [simple(1.0), simple(0.5, 1)]] * 3
    build_run(store, run_name, groups)
    run = store.runs.get(run_name)
    options = StepOptions(global_batch_size=4, n_samples_per_prompt=2)

    builder = StepBuilder(store, run, options)
    pending = GroupTracker(store, run, 2).poll()
    assert len(pending) == 9
    cursor, step, hashes = START_CURSOR, 0, []
    while (batch := builder.form(step + 1, pending, cursor)) is not None:
        hashes.append(batch.batch_hash)
        rest = pending[batch.consumed :]
        if store.db.dialect == "postgresql" and len(rest) >= options.groups_per_step:
            wanted = {m.session_id for g in rest[: options.groups_per_step] for m in g.members}
            assert builder.prefetch.read_ahead and builder.prefetch.read_ahead <= wanted
        pending, cursor, step = rest, batch.cursor, batch.step
    assert len(hashes) == 4

    direct = StepBuilder(store, run, options)  # every group's turns read when it is materialized
    groups_now = GroupTracker(store, run, 2).poll()
    expected = []
    for k in range(4):
        samples = []
        for group in groups_now[2 * k : 2 * k + 2]:
            group_samples, decision = direct.materialize_group(group, direct.trainer_version(k + 1), None)
            assert decision["kept"]
            samples += group_samples
        expected.append(samples)
    for step_hash, samples in zip(hashes, expected, strict=True):
        assign_loss_weights(samples)
        assert batch_hash(samples) == step_hash
    assert not direct.prefetch.read_ahead
