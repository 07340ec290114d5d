"""A trainer that says when it trains nothing (docs/training.md, "Steps that train nothing"):
offline staleness against the data's own versions, a step that would train 0 tokens stopped or
skipped (never committed silently), and the collapse warnings. SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dressage.errors import TrainingError
from dressage.store import EventStore
from dressage.training import MaskingPolicy, StepOptions, Trainer
from dressage.training.health import CollapseWatch
from dressage.training.multirun import MultiRunTrainer
from dressage.training.steps import NO_TRAINABLE_TOKENS
from tests.training.builders import build_run, simple

TRAINER = MaskingPolicy(max_staleness=1, staleness_reference="trainer")
DATA = MaskingPolicy(max_staleness=1, staleness_reference="data")


def _recorded_offline(store: EventStore, run: str, versions: list[int]) -> None:
    """One group of two trajectories per entry of ``versions``, all its tokens of that version."""
    build_run(store, run, [[simple(1.0, v), simple(0.0, v)] for v in versions])


def test_offline_the_data_s_own_versions_train_every_step(store: EventStore, run_name: str) -> None:
    # a recorded run of version 0 (the quickstart), then a later run's data of version 3
    _recorded_offline(store, run_name, [0, 0, 0, 0, 3, 3])
    results = Trainer(store, run_name, StepOptions(2, 2, masking=DATA)).run_steps()
    assert [r.batch.step for r in results] == [1, 2, 3, 4, 5, 6]
    assert all(r.batch.n_trainable == 12 for r in results)
    frontiers = [g["staleness_reference"] for r in results for g in r.batch.manifest["groups"]]
    assert frontiers == [0, 0, 0, 0, 3, 3]
    ckpt = store.consumers.checkpoint(run_name, "train:main")
    assert ckpt is not None and ckpt.state["data_version"] == 3
    # replay re-forms the same steps from the start (the frontier carried step to step)
    assert len(Trainer(store, run_name, StepOptions(2, 2, masking=DATA)).replay()) == 6


def test_the_data_frontier_masks_data_older_than_what_came_before(store: EventStore, run_name: str) -> None:
    # version 3 first, then version-0 data: 0 < 3 - 1 is stale against the frontier
    _recorded_offline(store, run_name, [3, 0])
    options = StepOptions(2, 2, masking=DATA, empty_steps="skip")
    [result] = Trainer(store, run_name, options).run_steps(max_steps=1)
    assert result.batch.n_trainable == 12 and result.batch.data_version == 3
    # resumed (the frontier comes back from the checkpoint): the version-0 group would form an
    # empty step, so it is skipped, and with nothing after it no step forms: said, not silent
    resumed = Trainer(store, run_name, options)
    assert resumed.run_steps() == []
    assert resumed.tail_warnings == [
        "skipped 1 group(s) (tasks 1) whose steps would train 0 tokens (masked: stale 12, not_generated 8; "
        "empty_steps: skip); no step after them could be formed yet, so no manifest lists them (they are "
        "skipped again when one is)"
    ]


def test_an_empty_step_stops_and_commits_nothing(store: EventStore, run_name: str) -> None:
    _recorded_offline(store, run_name, [0, 0, 0])
    trainer = Trainer(store, run_name, StepOptions(2, 2, masking=TRAINER))
    with pytest.raises(TrainingError) as e:
        trainer.run_steps()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "step 3 would train 0 tokens: its 20 response tokens are all masked (stale 12, not_generated 8); "
        "data policy versions 0..0"
    )
    assert (
        "trainer version 2 with max_staleness 1" in message and "stopped after 2 committed step(s)" in message
    )
    assert [s.step for s in store.consumers.steps(run_name, "train:main")] == [1, 2]


def test_an_empty_step_is_skipped_and_said(
    store: EventStore, run_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    build_run(
        store,
        run_name,
        [
            [simple(1.0, 0), simple(0.0, 0)],
            [simple(1.0, 0), simple(0.0, 0)],
            [simple(1.0, 3), simple(0.0, 3)],
        ],
    )
    options = StepOptions(2, 2, initial_version=2, masking=TRAINER, empty_steps="skip")
    with caplog.at_level(logging.WARNING, logger="dressage.training"):
        results = Trainer(store, run_name, options).run_steps()
    # step 1 trains version 2: groups 0 and 1 (version 0 < 2 - 1) are skipped, group 2 trains
    [result] = results
    assert result.batch.n_trainable == 12
    groups = result.batch.manifest["groups"]
    assert [(g["task_index"], g["kept"], g.get("reason")) for g in groups] == [
        (0, False, NO_TRAINABLE_TOKENS),
        (1, False, NO_TRAINABLE_TOKENS),
        (2, True, None),
    ]
    assert groups[0]["mask_reasons"] == {"stale": 12, "not_generated": 8}
    [warning] = result.warnings
    assert warning == (
        "step 1: skipped 2 group(s) (tasks 0, 1) whose steps would train 0 tokens (masked: stale 24, "
        "not_generated 16; empty_steps: skip); they are listed in the manifest as no_trainable_tokens"
    )
    assert warning in caplog.messages
    [recorded] = store.consumers.steps(run_name, "train:main")
    assert recorded.manifest["warnings"] == [warning]
    # the same step replays bitwise (the skip is part of how the step was formed)
    assert len(Trainer(store, run_name, options).replay()) == 1


def test_several_runs_measure_the_frontier_on_the_trainer_s_scale(store: EventStore, run_name: str) -> None:
    other = f"{run_name}-b"
    _recorded_offline(store, run_name, [0, 0, 0])
    _recorded_offline(store, other, [0, 0, 0])
    trainer = MultiRunTrainer(store, [run_name, other], StepOptions(2, 2, masking=DATA))
    batches = trainer.run_steps()
    assert len(batches) == 6 and all(b.n_trainable == 12 for b in batches)
    # the first run shifted by --version-offset 5: its data is newer, and the second run's group
    # taken after its first one (merged order) is stale against that frontier
    with pytest.raises(
        TrainingError,
        match=r"^step 2 would train 0 tokens: .*stale 12.*the newest version of the data consumed so far, 5 ",
    ):
        MultiRunTrainer(
            store,
            [run_name, other],
            StepOptions(2, 2, masking=DATA),
            consumer="offset",
            version_offsets=[5, 0],
        ).run_steps()
    assert len(store.consumers.steps(run_name, "train:offset")) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_collapse_warnings_fire_on_a_real_backend(
    store: EventStore, run_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dressage.training.torch_backend import TorchBackend

    # every group's rewards equal: GRPO's advantages are 0, so grad_norm is 0 exactly; the tiny
    # model's entropy (at most ln 4096 = 8.3 nats) is below a threshold of 100
    build_run(store, run_name, [[simple(1.0), simple(1.0)] for _ in range(3)])
    backend = TorchBackend(tmp_path / "ckpt", model="tiny-qwen3", lr=0.5, seed=3)
    watch = CollapseWatch(entropy_below=100.0, grad_norm_at_most=0.0, after_steps=2)
    trainer = Trainer(store, run_name, StepOptions(2, 2, masking=DATA), backend, watch=watch)
    with caplog.at_level(logging.WARNING, logger="dressage.training"):
        results = trainer.run_steps()
    assert [r.metrics["grad_norm"] for r in results] == [0.0, 0.0, 0.0]
    assert [len(r.warnings) for r in results] == [0, 2, 0]  # once, when the streak reaches 2 steps
    entropy, grad = results[1].warnings
    assert (
        entropy.startswith("policy entropy collapsed: ") and "for 2 consecutive steps (steps 1-2)" in entropy
    )
    assert grad.startswith("grad_norm 0 <= 0 (warn_grad_norm_at_most) for 2 consecutive steps (steps 1-2)")
    assert {entropy, grad} <= set(caplog.messages)
    assert store.consumers.steps(run_name, "train:main")[1].manifest["warnings"] == [entropy, grad]


def test_a_healthy_step_ends_a_streak() -> None:
    watch = CollapseWatch(entropy_below=0.1, grad_norm_at_most=0.0, after_steps=2)
    assert watch.observe(1, {"entropy": 0.05, "grad_norm": 1.0}) == []
    assert watch.observe(2, {"entropy": 3.0, "grad_norm": 0.0}) == []  # entropy recovered
    assert watch.observe(3, {"entropy": 0.05, "grad_norm": 0.5}) == []
    [w] = watch.observe(4, {"entropy": 0.04, "grad_norm": 0.5})
    assert "(steps 3-4)" in w
    assert watch.observe(5, {"grad_norm": 0.0}) == []  # a backend without entropy ends no streak
    assert watch.observe(6, {}) == []
