"""``train`` on a tree run (issue 34, point 7): without ``--advantage-estimator`` it takes the run's
(a loop's recorded ``train.advantage_estimator``, else ``tree`` for a tree run) and the flag
overrides it; ``--global-batch-size`` counts roots (a tree's forks come along, as its help says);
ready groups too few for a step are named, tree by tree, instead of being left untrained silently."""

from __future__ import annotations

from typer.testing import CliRunner

from dressage.cli import app
from dressage.store import EventStore, TaskSpec
from dressage.training.consumer import consumer_name
from tests.cli.helpers import invoke
from tests.log_builders import record_one_turn_session
from tests.training.test_trees import build_tree_run


def _args(*extra: str) -> list[str]:
    return ["--backend", "none", "--n-samples-per-prompt", "2", *extra]


def test_a_tree_run_trains_with_the_tree_estimator_by_default(
    cli: CliRunner, db_url: str, store: EventStore, run_name: str
) -> None:
    build_tree_run(store, run_name)  # one group: 2 roots, 3 forks
    result = invoke(cli, db_url, "train", "--from-run", run_name, *_args("--global-batch-size", "2"))
    assert result.exit_code == 0, result.output
    [step] = store.consumers.steps(run_name, consumer_name("main"))
    assert step.manifest["options"]["advantage_estimator"] == "tree"
    # a batch of 2 trajectories counts the 2 roots: the step holds the whole tree, 5 sessions
    assert step.manifest["n_trajectories"] == 5 and len(step.manifest["groups"]) == 1
    assert "not trained" not in result.stderr
    forced = invoke(
        cli, db_url, "train", "--from-run", run_name, "--consumer", "g",
        *_args("--global-batch-size", "2", "--advantage-estimator", "grpo"),
    )  # fmt: skip
    assert forced.exit_code != 0 and "with advantage estimator 'tree', not 'grpo'" in forced.stderr


def test_the_help_says_a_tree_counts_its_roots(cli: CliRunner) -> None:
    out = cli.invoke(app, ["train", "--help"]).output
    help_text = " ".join(out.replace("│", " ").split())
    assert "a tree counts its roots" in help_text, out


def test_groups_too_few_for_a_step_are_named(
    cli: CliRunner, db_url: str, store: EventStore, run_name: str
) -> None:
    build_tree_run(store, run_name)
    result = invoke(cli, db_url, "train", "--from-run", run_name, *_args("--global-batch-size", "4"))
    assert result.exit_code == 0, result.output
    assert store.consumers.steps(run_name, consumer_name("main")) == []
    err = " ".join(result.stderr.split())
    assert (
        "not trained: 1 ready group(s) wait for a full step of 2 groups (--global-batch-size 4 / 2 samples "
        "per group): group 0 (5 sessions, a tree with 3 forks); train them with --global-batch-size 2"
    ) in err, err


def test_a_loop_runs_recorded_estimator_is_the_default(
    cli: CliRunner, db_url: str, store: EventStore, run_name: str
) -> None:
    store.runs.create(run_name, {"loop": {"train": {"advantage_estimator": "reinforce"}}})
    store.tasks.enqueue(run_name, [TaskSpec(task_index=0, payload={})], n_samples=2)
    for i, pair in enumerate(store.tasks.pairs(run_name)):
        record_one_turn_session(
            store, run_name, f"{run_name}-{i}", task_id=pair.id, agent="a", ids=([1], [2]), version=0,
            reward=float(i),
        )  # fmt: skip
    result = invoke(cli, db_url, "train", "--from-run", run_name, *_args("--global-batch-size", "2"))
    assert result.exit_code == 0, result.output
    [step] = store.consumers.steps(run_name, consumer_name("main"))
    assert step.manifest["options"]["advantage_estimator"] == "reinforce"
