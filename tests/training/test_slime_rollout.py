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
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from sqlalchemy import text as sql_text

from dressage.errors import ConfigError, TrainingError
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
    if isinstance(nested[0][0], Sample):  # slime's plain shape: only when every trajectory is one segment
        nested = [[[s] for s in group] for group in nested]
    else:
        assert any(len(traj) > 1 for group in nested for traj in group)
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
    for turn in store.turns.read(session_id=session_id):
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
                "lineage": turns[0].thread_index,
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
        "    flat = [s for g in out.samples for t in g for s in (t if isinstance(t, list) else [t])]\n"
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
        ckpt = store.consumers.checkpoint(run_name, "train:slime")
        assert ckpt is not None and ckpt.step == step
    steps = store.consumers.steps(run_name, "train:slime")
    assert [s.manifest["backend"] for s in steps] == ["slime", "slime"]
    assert [sorted(g["task_index"] for g in s.manifest["groups"]) for s in steps] == [[0, 1], [2, 3]]
    assert steps[0].manifest["options"]["global_batch_size"] == 4  # rollout_batch_size x n
    assert len(flat) == 5  # rollout 1: TWO_ROOT has two segments
    # what slime's rollout side knows is recorded with each step: advantages, mask reasons; no weights
    decisions = store.consumers.decisions(run_name, "train:slime")
    assert sorted(decisions) == [1, 2]
    for s in steps:
        advantages = {int(k): v for g in s.manifest["groups"] for k, v in (g.get("advantages") or {}).items()}
        samples, recorded = s.manifest["samples"], decisions[s.step]
        assert [(d.session_id, d.segment_index) for d in recorded] == [
            (x["session"], x["segment"]) for x in samples
        ]
        assert [d.advantage for d in recorded] == [advantages[x["rollout_id"]] for x in samples]
        assert [d.mask_reasons.size for d in recorded] == [
            x["response"][1] - x["response"][0] for x in samples
        ]
        assert all(d.importance_weights is None for d in recorded)
    # asked again (slime restarted from its checkpoint before rollout 0): the same samples, re-formed
    check_rollout(store, run_name, 1, call_like_slime(args, 0)[0])
    assert store.consumers.checkpoint(run_name, "train:slime").step == 2

    # rollout 2 waits until two more groups are ready
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(call_like_slime(args, 2)), daemon=True)
    waiting.start()
    waiting.join(timeout=1.5)  # it must still be waiting after 1.5 s
    assert waiting.is_alive() and store.consumers.checkpoint(run_name, "train:slime").step == 2
    build_run(store, run_name, GROUPS[4:], seed=6, first_task=4)
    waiting.join(timeout=60)
    assert not waiting.is_alive() and got, "generate_rollout did not pick up the new groups"
    check_rollout(store, run_name, 3, got[0][0])
    assert len(store.consumers.steps(run_name, "train:slime")) == 3

    # slime crashed after its checkpoint of rollout 0 and restarts in a new process: rollouts 1 and
    # 2 are re-formed from the log (hash-checked, not committed again), rollout 3 waits for data
    before = [(s.step, s.batch_hash) for s in store.consumers.steps(run_name, "train:slime")]
    again = restarted_slime(args, [1, 2], tmp_path)
    assert [r["metrics"]["dressage/step"] for r in again] == [2, 3]
    assert [r["samples"] for r in again] == [
        [[s.session_id, s.tokens] for g in nested for t in g for s in t]
        for nested in (call_like_slime(args, 1)[0], got[0][0])
    ]
    after = [(s.step, s.batch_hash) for s in store.consumers.steps(run_name, "train:slime")]
    assert after == before and store.consumers.checkpoint(run_name, "train:slime").step == 3

    # a slime that is ahead of the log, evaluation, and slime's own normalisation: clear errors
    with pytest.raises(TrainingError, match=r"rollout 5 \(step 6\).*holds steps 1\.\.3"):
        generate_rollout(args, 5, None)
    with pytest.raises(ConfigError, match="no eval: section"):
        generate_rollout(args, 3, None, evaluation=True)
    with pytest.raises(ConfigError, match="--disable-rewards-normalization"):
        generate_rollout(slime_args(run_name, db_url, rewards_normalization=True), 3, None)
    assert store.consumers.checkpoint(run_name, "train:slime").step == 3


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
    assert store.consumers.checkpoint(run_name, "train:slime-b").step == 1
    assert store.consumers.checkpoint(run_name, "train:slime") is None
    # std normalisation: group 1's rewards are equal (advantage 0), group 0's are 1 and 0
    assert [round(s.reward, 4) for s in flat if s.group_index == 1] == [0.0, 0.0]
    std = float(np.std([1.0, 0.0]))  # dressage's GRPO uses the population std (ddof=0)
    first = next(s for s in flat if s.group_index == 0 and s.index == 0)
    assert first.reward == pytest.approx(0.5 / (std + 1e-6), rel=1e-5)
    with pytest.raises(ConfigError, match="rollout_batch_size"):
        generate_rollout(SimpleNamespace(rewards_normalization=False), 0, None)


RECORDED = {"rollout": {"n_samples_per_prompt": 2}}


def test_no_args_options_from_the_recorded_config_and_a_fresh_consumer_starts_at_slimes_rollout(
    slime_on_path: None, store: EventStore, db_url: str, run_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slime.utils.types import Sample

    build_run(store, run_name, GROUPS[4:], seed=5, config=RECORDED)  # 2 one-segment groups
    monkeypatch.setenv("DRESSAGE_RUN", run_name)
    monkeypatch.setenv("DRESSAGE_DATABASE_URL", db_url)
    # slime's contract calls fn(None, 2, data_source): n from the run, P = the run's 2 tasks
    out = generate_rollout(None, 2, None)
    assert [[type(s) for s in group] for group in out.samples] == [[Sample, Sample]] * 2  # plain shape
    assert out.metrics["dressage/step"] == 3
    ckpt = store.consumers.checkpoint(run_name, "train:slime")
    assert ckpt is not None and ckpt.step == 3 and ckpt.state["start_step"] == 2
    (step,) = store.consumers.steps(run_name, "train:slime")
    assert step.step == 3 and step.manifest["trainer_version"] == 2
    assert step.manifest["options"]["global_batch_size"] == 4
    # asked again (slime restarted at rollout 2): the same step, re-formed, not committed twice
    again = generate_rollout(None, 2, None)
    assert [[s.tokens for s in g] for g in again.samples] == [[s.tokens for s in g] for g in out.samples]
    assert len(store.consumers.steps(run_name, "train:slime")) == 1
    with pytest.raises(TrainingError, match=r"rollout 1 \(step 2\).*holds steps 3\.\.3"):
        generate_rollout(None, 1, None)
    # a mismatch with the log keeps its clear error
    with pytest.raises(TrainingError, match="n-samples-per-prompt is 3"):
        generate_rollout(
            SimpleNamespace(n_samples_per_prompt=3, rollout_batch_size=1, dressage_consumer="b"), 0, None
        )


def test_masking_options_from_slimes_args(
    slime_on_path: None, store: EventStore, db_url: str, run_name: str
) -> None:
    # tokens of version 0; a consumer starting at rollout 2 updates version 2 weights:
    # --dressage-max-staleness 1 masks every generated token (0 < 2 - 1): a step that would train
    # nothing is refused, not served (docs/training.md); 2 keeps them all
    build_run(store, run_name, GROUPS[4:], seed=5, config=RECORDED)
    strict = slime_args(run_name, db_url, dressage_max_staleness=1, dressage_consumer="strict")
    with pytest.raises(
        TrainingError,
        match=r"step 3 would train 0 tokens: .*stale \d+.*trainer version 2 with max_staleness 1",
    ):
        call_like_slime(strict, 2)
    assert store.consumers.steps(run_name, "train:strict") == []
    loose = slime_args(run_name, db_url, dressage_max_staleness=2, dressage_consumer="loose")
    _, flat, _ = call_like_slime(loose, 2)
    assert all(sum(s.loss_mask) == s.response_length - 4 for s in flat)  # 2 turns x 3, the 2nd's 4 context


def play_eval(store: EventStore, run: str, version: int, rewards: list[float], seed: int = 0) -> list[str]:
    """Enqueue version ``version``'s eval round (one task per reward) and play it like a worker."""
    from dressage.agents.base import Task
    from dressage.rollout.evaluation import eval_specs
    from tests.training.builders import turn_records

    tasks = [Task(index=i, prompt=f"eval {i}") for i in range(len(rewards))]
    store.tasks.enqueue(run, eval_specs(tasks, version), 1, eval_version=version)
    rng = np.random.default_rng(seed)
    sids = []
    while leases := store.tasks.claim(run, "eval-worker", n=1):
        lease = leases[0]
        assert lease.kind == "eval" and lease.eval_version == version
        sid = f"{run}-eval{version}-t{lease.task_index}"
        info = {"task_index": lease.task_index, "eval_version": version}
        store.sessions.open(run, session_id=sid, task_id=lease.task_id, info=info)
        for rec in turn_records(sid, simple(0.0), rng):
            store.turns.append(run, rec)
        store.sessions.finalize(sid, "finished", reward=rewards[lease.task_index - version * len(rewards)])
        store.tasks.release(lease, "done")
        sids.append(sid)
    return sids


def test_evaluation_serves_the_newest_complete_round_at_or_after_the_current_version(
    slime_on_path: None, store: EventStore, db_url: str, run_name: str
) -> None:
    from slime.rollout.base_types import RolloutFnEvalOutput, call_rollout_fn
    from slime.utils.types import Sample

    config = {"rollout": {"n_samples_per_prompt": 2, "eval": {"name": "held-out", "every": 1}}}
    build_run(store, run_name, GROUPS[4:], seed=5, config=config)
    v0 = play_eval(store, run_name, 0, [1.0, 0.0, 0.5])
    args = slime_args(run_name, db_url)
    out = call_rollout_fn(generate_rollout, args, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput) and out.metrics["dressage/eval_version"] == 0
    data = out.data["held-out"]
    assert data["rewards"] == [1.0, 0.0, 0.5] and data["truncated"] == [False] * 3
    assert [s.session_id for s in data["samples"]] == v0
    assert [s.reward for s in data["samples"]] == [1.0, 0.0, 0.5]
    for s, sid in zip(data["samples"], v0, strict=True):
        assert isinstance(s, Sample) and s.tokens == expected_segments(store, sid)[0]["tokens"]
    # the trainer never sees eval sessions
    _, flat, _ = call_like_slime(args, 0)
    assert not {s.session_id for s in flat} & set(v0)

    # version 1 is served now: version 0's round no longer counts; wait for version 1's
    store.versions.record(run_name, 1)
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(generate_rollout(args, 1, None, True)), daemon=True)
    waiting.start()
    waiting.join(timeout=1.5)  # it must still be waiting after 1.5 s
    assert waiting.is_alive()
    play_eval(store, run_name, 1, [0.25, 0.75, 1.0], seed=1)
    waiting.join(timeout=60)
    assert got and got[0].metrics["dressage/eval_version"] == 1
    assert got[0].data["held-out"]["rewards"] == [0.25, 0.75, 1.0]
    # in the SQL view, eval sessions say so
    with store.db.engine.connect() as conn:
        rows = conn.execute(
            sql_text(
                "SELECT kind, eval_version, COUNT(*) FROM trajectories WHERE run_name = :r GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            {"r": run_name},
        ).all()
    assert [tuple(r) for r in rows] == [("eval", 0, 3), ("eval", 1, 3), ("train", None, 4)]


def test_prompt_equal_reducer_gives_the_torch_backends_loss(
    slime_on_path: None, store: EventStore, db_url: str, run_name: str
) -> None:
    from dressage.integrations.slime import (
        PG_LOSS_REDUCER_PATH,
        prompt_equal_pg_loss_reducer,
        prompt_equal_rewards,
    )
    from dressage.training import StepOptions, Trainer

    build_run(store, run_name, GROUPS[:2], seed=5)
    (result,) = Trainer(store, run_name, StepOptions(4, 2), consumer="weights").run_steps()
    samples = result.batch.samples
    G = 4
    rewards = prompt_equal_rewards(samples, G)
    rng = np.random.default_rng(0)
    l_T = [torch.from_numpy(rng.normal(size=s.response_length)) for s in samples]  # per-token loss / A
    # slime: pg_loss per token is linear in the advantage (written into reward); the reducer
    # output is multiplied by 1/G (one micro-batch, one data-parallel rank)
    pg_T = torch.cat([r * x_R for r, x_R in zip(rewards, l_T, strict=True)])
    masks = [torch.as_tensor(s.loss_mask, dtype=torch.int32) for s in samples]
    lengths = [len(s.tokens) for s in samples]
    reducer = prompt_equal_pg_loss_reducer(lengths, [s.response_length for s in samples], masks)
    slime_loss = float(reducer(pg_T)) / G
    torch_loss = sum(
        float((torch.as_tensor(s.loss_weights, dtype=torch.float64) * s.advantage * x_R).sum())
        for s, x_R in zip(samples, l_T, strict=True)
    )
    assert slime_loss == pytest.approx(torch_loss, rel=1e-6) and torch_loss != 0.0
    with pytest.raises(ConfigError, match="calculate-per-token-loss"):
        prompt_equal_pg_loss_reducer(lengths, [s.response_length for s in samples], masks, True)

    # generate_rollout scales the rewards when slime uses the reducer; G must be the rollout's
    args = slime_args(run_name, db_url, custom_pg_loss_reducer_function_path=PG_LOSS_REDUCER_PATH)
    with pytest.raises(ConfigError, match="--global-batch-size to the rollout's 4 trajectories"):
        generate_rollout(args, 0, None)
    args.global_batch_size = 4
    _, flat, _ = call_like_slime(args, 0)
    assert [s.reward for s in flat] == pytest.approx(rewards)
    assert [s.metadata["dressage_advantage"] for s in flat] == pytest.approx([s.advantage for s in samples])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_train_cli_prints_eval_rewards_and_the_slime_commands(
    store: EventStore, db_url: str, run_name: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from dressage.cli import app

    config = {"rollout": {"n_samples_per_prompt": 2, "eval": {"name": "held-out"}}}
    build_run(store, run_name, GROUPS[4:], seed=5, config=config)
    play_eval(store, run_name, 0, [1.0, 0.0])
    store.versions.record(run_name, 1)
    play_eval(store, run_name, 1, [1.0, 1.0], seed=1)
    args = ["train", "--from-run", run_name, "--backend", "slime-dump", "--out", str(tmp_path / "dump")]
    args += ["--global-batch-size", "4", "--n-samples-per-prompt", "2", "--max-staleness", "1"]
    result = CliRunner().invoke(app, [*args, "--database-url", db_url])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "held-out reward per policy version: v0 0.500, v1 1.000" in out
    assert (
        out.count(
            "--custom-pg-loss-reducer-function-path dressage.integrations.slime.prompt_equal_pg_loss_reducer"
        )
        == 2
    )
    assert "--dressage-max-staleness 1" in out and f"--dressage-run {run_name}" in out
