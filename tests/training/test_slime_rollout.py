"""``generate_rollout`` called as slime calls it, against a stand-in of slime's interface.

slime is not installable here; ``fake_slime/`` (see its README) provides ``slime.utils.types.Sample``
and ``slime.rollout.base_types`` with the interface of the pinned slime commit, on ``sys.path`` only
inside these tests. Expected sample contents are computed from the stored turns directly, not by
the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.integrations.slime import SLIME_COMMIT, generate_rollout
from dressage.store import EventStore
from tests.training.builders import SegmentSpec, TrajSpec, TurnSpec, build_run, simple
from tests.training.test_backends import SLIME_SAMPLE_FIELDS

FAKE_SLIME = Path(__file__).with_name("fake_slime")
REPO = Path(__file__).resolve().parents[2]

# 6 groups of 2: three slime rollouts of rollout_batch_size=2 prompts. Group 0's first trajectory
# has a subagent segment (lineage 1) between two root turns; group 3's first one has a second
# root segment after a boundary (its anchor is that last root segment).
SUB = TrajSpec(
    1.0,
    [SegmentSpec(0, [TurnSpec(4, 3), TurnSpec(2, 3)]), SegmentSpec(1, [TurnSpec(5, 2)], "subagent")],
    order=[(0, 0), (1, 0), (0, 1)],
)
TWO_ROOT = TrajSpec(
    2.0, [SegmentSpec(0, [TurnSpec(3, 2)]), SegmentSpec(0, [TurnSpec(6, 2)], "think_stripped")]
)
GROUPS: list[list[Any]] = [
    [SUB, simple(0.0)],
    [simple(1.0), simple(1.0)],
    [simple(0.0), simple(3.0)],
    [TWO_ROOT, simple(0.0)],
    [simple(1.0), simple(0.0)],
    [simple(0.5), simple(1.5)],
]
REWARDS = {(g, k): spec.reward for g, grp in enumerate(GROUPS) for k, spec in enumerate(grp)}


@pytest.fixture
def slime_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """``import slime`` finds the stand-in for this test only."""

    def forget() -> None:
        for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
            del sys.modules[name]

    forget()
    monkeypatch.syspath_prepend(str(FAKE_SLIME))
    monkeypatch.setenv("DRESSAGE_HOME", str(tmp_path / "home"))
    for var in ("DRESSAGE_RUN", "DRESSAGE_DATABASE_URL", "DRESSAGE_CONSUMER"):
        monkeypatch.delenv(var, raising=False)
    yield
    forget()


def slime_args(run: str, url: str, **over: Any) -> SimpleNamespace:
    """The fields of slime's parsed arguments that a rollout function can read, as slime sets them
    for ``--rollout-batch-size 2 --n-samples-per-prompt 2 --global-batch-size 2
    --disable-rewards-normalization --debug-train-only`` plus dressage's two custom arguments."""
    values: dict[str, Any] = {
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "global_batch_size": 2,  # two optimizer steps per rollout, slime's business
        "num_steps_per_rollout": None,
        "over_sampling_batch_size": 2,
        "rewards_normalization": False,
        "grpo_std_normalization": False,
        "advantage_estimator": "grpo",
        "debug_train_only": True,
        "rollout_function_path": "dressage.integrations.slime.generate_rollout",
        "eval_function_path": "dressage.integrations.slime.generate_rollout",
        "dressage_run": run,
        "dressage_database_url": url,
    }
    values.update(over)
    return SimpleNamespace(**values)


def call_like_slime(args: SimpleNamespace, rollout_id: int) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """What slime's RolloutManager does with a rollout function's output: call it through
    ``call_rollout_fn``, check that nested siblings share ``rollout_id``, flatten, check lengths.
    Returns (nested output, flat samples, metrics)."""
    from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
    from slime.utils.types import Sample

    out = call_rollout_fn(generate_rollout, args, rollout_id, object(), evaluation=False)
    assert isinstance(out, RolloutFnTrainOutput)
    nested = out.samples
    for group in nested:
        for traj in group:
            assert isinstance(traj, list) and all(isinstance(s, Sample) for s in traj)
            assert len({s.rollout_id for s in traj}) == 1 and traj[0].rollout_id is not None
    flat = [s for group in nested for traj in group for s in traj]
    for s in flat:
        assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs)
    return nested, flat, out.metrics


def expected_segments(store: EventStore, session_id: str) -> list[dict[str, Any]]:
    """The training view of a session's segments, computed straight from its stored turns:
    tokens = every turn's context + generated ids, the response starts at the first generated
    token, loss mask 1 on generated tokens, logprob 0.0 on context tokens, experts concatenated."""
    by_segment: dict[int, list[Any]] = {}
    for turn in store.read_turns(session_id=session_id):
        by_segment.setdefault(turn.segment_index, []).append(turn)
    out = []
    for seg, turns in by_segment.items():
        tokens = np.concatenate([np.concatenate([t.context_ids, t.generated_ids]) for t in turns])
        gen = np.concatenate([[0] * len(t.context_ids) + [1] * len(t.generated_ids) for t in turns])
        lps = np.concatenate([np.concatenate([np.zeros(len(t.context_ids)), t.logprobs]) for t in turns])
        start = int(np.argmax(gen))
        out.append(
            {
                "segment": seg,
                "lineage": turns[0].lineage_index,
                "tokens": tokens.tolist(),
                "response_length": len(tokens) - start,
                "loss_mask": gen[start:].tolist(),
                "rollout_log_probs": lps[start:].astype(np.float32).tolist(),
                "experts": np.concatenate([t.routed_experts for t in turns]).astype(np.int32),
            }
        )
    return out


def check_rollout(store: EventStore, run: str, step: int, nested: list[Any]) -> None:
    """Rollout ``step - 1`` holds exactly task indexes ``2(step-1), 2(step-1)+1``, every segment as
    the log recorded it, with the GRPO advantage of its trajectory's anchor as reward."""
    from slime.utils.types import Sample

    first_task = 2 * (step - 1)
    assert [g[0][0].group_index for g in nested] == [first_task, first_task + 1]
    for g, group in enumerate(nested):
        task = first_task + g
        mean = (REWARDS[(task, 0)] + REWARDS[(task, 1)]) / 2
        assert len(group) == 2
        for k, traj in enumerate(group):
            sid = f"{run}-t{task}-s{k}-a1"
            want = expected_segments(store, sid)
            assert len(traj) == len(want)
            for s, w in zip(traj, want, strict=True):
                assert s.session_id == sid and s.metadata["dressage_segment"] == w["segment"]
                assert s.tokens == w["tokens"]
                assert s.response_length == w["response_length"]
                assert s.loss_mask == w["loss_mask"]
                assert s.rollout_log_probs == w["rollout_log_probs"]
                assert torch.equal(s.rollout_routed_experts, torch.from_numpy(w["experts"]))
                assert s.reward == pytest.approx(REWARDS[(task, k)] - mean)
                assert s.metadata["raw_reward"] == REWARDS[(task, k)]
                assert s.status is Sample.Status.COMPLETED
                assert (s.group_index, s.index, s.rollout_id) == (task, task * 2 + k, task * 2 + k)
                assert s.weight_versions == ["0"]
            anchors = [s.metadata["dressage_anchor"] for s in traj]
            root = [i for i, w in enumerate(want) if w["lineage"] == 0]
            assert anchors == [i == root[-1] for i in range(len(traj))]


def restarted_slime(args: SimpleNamespace, rollout_ids: list[int], tmp_path: Path) -> list[dict[str, Any]]:
    """A new process (slime restarted from its checkpoint) asks for ``rollout_ids``; returns, per
    rollout, its metrics and every sample's (session, tokens)."""
    script = (
        "import json, sys, types\n"
        "from slime.rollout.base_types import call_rollout_fn\n"
        "from dressage.integrations.slime import generate_rollout\n"
        "args = types.SimpleNamespace(**json.loads(sys.argv[1]))\n"
        "for rid in json.loads(sys.argv[2]):\n"
        "    out = call_rollout_fn(generate_rollout, args, rid, None, evaluation=False)\n"
        "    flat = [s for g in out.samples for t in g for s in t]\n"
        "    print(json.dumps({'metrics': out.metrics,\n"
        "                      'samples': [[s.session_id, s.tokens] for s in flat]}))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKE_SLIME), str(REPO)]),
        "DRESSAGE_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(vars(args)), json.dumps(rollout_ids)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_stand_in_sample_has_slimes_fields(slime_on_path: None) -> None:
    from slime.utils.types import Sample

    assert SLIME_COMMIT in (FAKE_SLIME / "README.md").read_text()
    d = Sample(tokens=[1, 2], status=Sample.Status.TRUNCATED).to_dict()
    assert set(d) == SLIME_SAMPLE_FIELDS and d["status"] == "truncated"
    assert Sample.from_dict(d) == Sample(tokens=[1, 2], status=Sample.Status.TRUNCATED)


def test_generate_rollout_serves_each_step_once_and_resumes(
    slime_on_path: None, store: EventStore, db_url: str, run_name: str, tmp_path: Path
) -> None:
    build_run(store, run_name, GROUPS[:4], seed=5)
    args = slime_args(run_name, db_url)

    # rollouts 0 and 1: steps 1 and 2, committed with the consumer checkpoint before slime trains
    for rollout_id in (0, 1):
        nested, flat, metrics = call_like_slime(args, rollout_id)
        step = rollout_id + 1
        check_rollout(store, run_name, step, nested)
        assert metrics["dressage/step"] == step and metrics["dressage/trajectories"] == 4
        assert metrics["dressage/samples"] == len(flat)
        ckpt = store.get_checkpoint(run_name, "train:slime")
        assert ckpt is not None and ckpt.step == step
    steps = store.list_steps(run_name, "train:slime")
    assert [s.manifest["backend"] for s in steps] == ["slime", "slime"]
    assert [sorted(g["task_index"] for g in s.manifest["groups"]) for s in steps] == [[0, 1], [2, 3]]
    assert steps[0].manifest["options"]["global_batch_size"] == 4  # rollout_batch_size x n
    assert len(flat) == 5  # rollout 1: TWO_ROOT has two segments
    # asked again (slime restarted from its checkpoint before rollout 0): the same samples, re-formed
    check_rollout(store, run_name, 1, call_like_slime(args, 0)[0])
    assert store.get_checkpoint(run_name, "train:slime").step == 2

    # rollout 2 waits until two more groups are ready
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(call_like_slime(args, 2)), daemon=True)
    waiting.start()
    time.sleep(1.5)
    assert waiting.is_alive() and store.get_checkpoint(run_name, "train:slime").step == 2
    build_run(store, run_name, GROUPS[4:], seed=6, first_task=4)
    waiting.join(timeout=60)
    assert not waiting.is_alive() and got, "generate_rollout did not pick up the new groups"
    check_rollout(store, run_name, 3, got[0][0])
    assert len(store.list_steps(run_name, "train:slime")) == 3

    # slime crashed after its checkpoint of rollout 0 and restarts in a new process: rollouts 1 and
    # 2 are re-formed from the log (hash-checked, not committed again), rollout 3 waits for data
    before = [(s.step, s.batch_hash) for s in store.list_steps(run_name, "train:slime")]
    again = restarted_slime(args, [1, 2], tmp_path)
    assert [r["metrics"]["dressage/step"] for r in again] == [2, 3]
    assert [r["samples"] for r in again] == [
        [[s.session_id, s.tokens] for g in nested for t in g for s in t]
        for nested in (call_like_slime(args, 1)[0], got[0][0])
    ]
    after = [(s.step, s.batch_hash) for s in store.list_steps(run_name, "train:slime")]
    assert after == before and store.get_checkpoint(run_name, "train:slime").step == 3

    # a slime that is ahead of the log, evaluation, and slime's own normalisation: clear errors
    with pytest.raises(TrainingError, match=r"rollout 5 \(step 6\).*committed only 3 steps"):
        generate_rollout(args, 5, None)
    with pytest.raises(NotSupportedError, match="--eval-function-path"):
        generate_rollout(args, 3, None, evaluation=True)
    with pytest.raises(ConfigError, match="--disable-rewards-normalization"):
        generate_rollout(slime_args(run_name, db_url, rewards_normalization=True), 3, None)
    assert store.get_checkpoint(run_name, "train:slime").step == 3


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_generate_rollout_settings_from_the_environment(
    slime_on_path: None,
    store: EventStore,
    db_url: str,
    run_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build_run(store, run_name, GROUPS[:2], seed=5)
    args = slime_args("", "", grpo_std_normalization=True)
    del args.dressage_run, args.dressage_database_url
    with pytest.raises(ConfigError, match="DRESSAGE_RUN"):
        generate_rollout(args, 0, None)
    monkeypatch.setenv("DRESSAGE_RUN", run_name)
    monkeypatch.setenv("DRESSAGE_DATABASE_URL", db_url)
    monkeypatch.setenv("DRESSAGE_CONSUMER", "slime-b")
    _, flat, _ = call_like_slime(args, 0)
    assert store.get_checkpoint(run_name, "train:slime-b").step == 1
    assert store.get_checkpoint(run_name, "train:slime") is None
    # std normalisation: group 1's rewards are equal (advantage 0), group 0's are 1 and 0
    assert [round(s.reward, 4) for s in flat if s.group_index == 1] == [0.0, 0.0]
    std = float(np.std([1.0, 0.0]))  # dressage's GRPO uses the population std (ddof=0)
    first = next(s for s in flat if s.group_index == 0 and s.index == 0)
    assert first.reward == pytest.approx(0.5 / (std + 1e-6), rel=1e-5)
    with pytest.raises(ConfigError, match="rollout_batch_size"):
        generate_rollout(SimpleNamespace(rewards_normalization=False), 0, None)
