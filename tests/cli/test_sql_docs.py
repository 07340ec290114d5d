"""Every query in docs/sql.md runs on both backends; the five worked examples give known numbers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dressage.store import EventStore
from dressage.store.decisions import SampleDecision
from tests.cli.conftest import Populated
from tests.cli.helpers import add_eval_session, sql_json
from tests.view.builders import build_fork_tree

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"


def doc_queries() -> dict[str, str]:
    """``### heading`` -> the first ```sql block under it (unnamed blocks keyed ``extra-N``)."""
    queries: dict[str, str] = {}
    heading = None
    for block in re.split(r"^(### .*)$", DOC.read_text(), flags=re.MULTILINE):
        if block.startswith("### "):
            heading = block[4:].strip()
            continue
        for i, sql in enumerate(re.findall(r"```sql\n(.*?)```", block, flags=re.DOTALL)):
            key = heading if i == 0 and heading and heading not in queries else f"extra-{len(queries)}"
            queries[key] = sql
    return queries


def run_doc(cli: CliRunner, db_url: str, populated: Populated, title: str) -> list[dict]:
    return sql_json(cli, db_url, doc_queries()[title].replace("'my-run'", f"'{populated.run}'"))


def test_doc_has_the_worked_examples() -> None:
    titles = set(doc_queries())
    assert {
        "Mean reward per policy version",
        "Tokens and turns per session",
        "Share of trained tokens",
        "Sessions that hit the context limit",
        "Logprob distribution of trained tokens",
    } <= titles
    assert all("'my-run'" in q for q in doc_queries().values())


def test_mean_reward_per_policy_version(cli: CliRunner, db_url: str, populated: Populated) -> None:
    rows = run_doc(cli, db_url, populated, "Mean reward per policy version")
    assert rows == [
        {"policy_version": 0, "sessions": 1, "mean_reward": 0.0},
        {"policy_version": 1, "sessions": 1, "mean_reward": 1.0},
    ]


def test_tokens_and_turns_per_session(cli: CliRunner, db_url: str, populated: Populated) -> None:
    rows = run_doc(cli, db_url, populated, "Tokens and turns per session")
    got = [(r["n_turns"], r["n_segments"], r["n_tokens"], r["n_trained_tokens"], r["status"]) for r in rows]
    assert got == [
        (3, 2, 15, 5, "finished"),
        (1, 1, 4, 2, "finished"),
        (1, 1, 2, 1, "failed"),
        (1, 1, 1, 0, "running"),
    ]


def test_share_of_trained_tokens(cli: CliRunner, db_url: str, populated: Populated) -> None:
    [row] = run_doc(cli, db_url, populated, "Share of trained tokens")
    assert (row["trained_tokens"], row["tokens"]) == (8, 22)
    assert row["trained_share"] == pytest.approx(8 / 22)


def test_sessions_that_hit_the_context_limit(cli: CliRunner, db_url: str, populated: Populated) -> None:
    rows = run_doc(cli, db_url, populated, "Sessions that hit the context limit")
    s = populated.sessions
    got = {r["session_id"]: (r["length_turns"], r["overflow_events"]) for r in rows}
    assert got == {s["s1"]: (1, 0), s["s3"]: (0, 0), s["s4"]: (0, 1)}


def test_logprob_distribution_of_trained_tokens(cli: CliRunner, db_url: str, populated: Populated) -> None:
    rows = run_doc(cli, db_url, populated, "Logprob distribution of trained tokens")
    assert [r["tokens"] for r in rows] == [1, 2, 2, 2, 1]
    assert rows[0]["bucket"].startswith("1:") and rows[-1]["bucket"].startswith("5:")


def test_every_documented_query_runs(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore
) -> None:
    add_eval_session(store, populated.run, version=1, reward=0.25)  # for the eval query
    store.consumers.commit_step(  # for the step-metrics queries
        populated.run,
        "train:main",
        step=1,
        position=1,
        batch_hash="0" * 64,
        manifest={},
        metrics={"loss": -0.5, "grad_norm": 2.0, "staleness_tokens_0": 5},
        decisions=[_s1_decision(populated)],
    )
    fork = f"{populated.run}-fork"  # for the fork-tree queries
    store.sessions.open(
        populated.run, session_id=fork, parent_session_id=populated.sessions["s1"], fork_turn=1
    )
    for title, query in doc_queries().items():
        rows = sql_json(cli, db_url, query.replace("'my-run'", f"'{populated.run}'"))
        assert rows, title


def _s1_decision(populated: Populated) -> SampleDecision:
    """A step's decision about s1's segment 0 (positions 0-3 prompt, 4-6 sampled, 7-8 context, 9
    sampled and 10 sampled but recorded untrained): its response starts at 4."""
    return SampleDecision(
        sample=0,
        session_id=populated.sessions["s1"],
        segment_index=0,
        response_start=4,
        advantage=0.5,
        mask_reasons=np.asarray([0, 0, 0, 2, 2, 0, 3], np.uint8),
        importance_weights=np.asarray([1.0, 0.5, 2.0, 0, 0, 1.25, 0], np.float32),
    )


def test_why_a_token_was_not_trained(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore
) -> None:
    store.consumers.commit_step(
        populated.run, "train:main", step=1, position=1, batch_hash="0" * 64, manifest={},
        decisions=[_s1_decision(populated)],
    )  # fmt: skip
    rows = run_doc(cli, db_url, populated, "Why a token was (not) trained")
    assert [r["position"] for r in rows] == list(range(11))  # every token of the segment, once
    assert [r["token_id"] for r in rows] == [248045, 872, 198, 9707, 100, 101, 102, 198, 200, 103, 104]
    assert [r["mask_reason"] for r in rows] == ["prompt"] * 4 + [
        "trained", "trained", "trained", "not_generated", "not_generated", "trained", "recorded_untrained",
    ]  # fmt: skip
    assert [r["importance_weight"] for r in rows] == [None] * 4 + [1.0, 0.5, 2.0, 0, 0, 1.25, 0]
    assert {r["advantage"] for r in rows} == {0.5}
    counts = sql_json(
        cli, db_url, _next_query("Why a token was (not) trained").replace("'my-run'", f"'{populated.run}'")
    )
    assert [(r["mask_reason"], r["tokens"]) for r in counts] == [
        ("not_generated", 2), ("recorded_untrained", 1), ("trained", 4),
    ]  # fmt: skip


def _next_query(title: str) -> str:
    """The query block of docs/sql.md that follows ``title``'s first one."""
    queries = doc_queries()
    return list(queries.values())[list(queries).index(title) + 1]


def test_training_curves(cli: CliRunner, db_url: str, populated: Populated, store: EventStore) -> None:
    for step, loss in ((1, -0.5), (2, 0.25)):
        store.consumers.commit_step(
            populated.run,
            "train:main",
            step=step,
            position=step,
            batch_hash=str(step) * 64,
            manifest={},
            metrics={"loss": loss, "grad_norm": 2.0 * step, "staleness_tokens_1": 3},
        )
    rows = run_doc(cli, db_url, populated, "Training curves")
    assert [(r["step"], r["loss"], r["grad_norm"], r["entropy"]) for r in rows] == [
        (1, -0.5, 2.0, None),
        (2, 0.25, 4.0, None),
    ]


def test_eval_sessions_stay_out_of_the_training_curve(
    cli: CliRunner, db_url: str, populated: Populated, store: EventStore
) -> None:
    """An eval session of policy 1 (reward 0.25) changes neither the training query's rows nor the
    run's training mean; the eval query returns it alone."""
    add_eval_session(store, populated.run, version=1, reward=0.25)
    rows = run_doc(cli, db_url, populated, "Mean reward per policy version")
    assert rows == [
        {"policy_version": 0, "sessions": 1, "mean_reward": 0.0},
        {"policy_version": 1, "sessions": 1, "mean_reward": 1.0},
    ]
    assert run_doc(cli, db_url, populated, "Eval reward per policy version") == [
        {"eval_version": 1, "sessions": 1, "mean_reward": 0.25}
    ]
    kinds = {
        r["session_id"]: r["kind"] for r in run_doc(cli, db_url, populated, "Tokens and turns per session")
    }
    assert kinds[f"{populated.run}-eval-1-0"] == "eval"
    assert {k for s, k in kinds.items() if not s.endswith("-eval-1-0")} == {None}  # no task: not eval


def test_fork_tree_queries(cli: CliRunner, db_url: str, store: EventStore, run_name: str) -> None:
    tree = build_fork_tree(store, run_name)
    queries = doc_queries()
    walk = next(q for q in queries.values() if "WITH RECURSIVE up" in q)
    rows = sql_json(cli, db_url, queries["Fork trees"].replace("'my-run'", f"'{run_name}'"))
    assert rows == [{"root_session_id": tree.root, "sessions": 4, "depth": 2, "best_reward": 1.0}]
    rows = sql_json(cli, db_url, walk.replace("'my-run'", f"'{run_name}'"))
    assert [(r["session_id"], r["ancestor_id"], r["shared_turns"], r["hops"]) for r in rows] == sorted(
        [
            (tree.a, tree.root, 2, 1),
            (tree.aa, tree.a, 3, 1),
            (tree.aa, tree.root, 2, 2),
            (tree.b, tree.root, 2, 1),
        ]
    )
    shared = sql_json(
        cli, db_url, f"SELECT session_id, shared_tokens FROM session_tree WHERE session_id = '{tree.aa}'"
    )
    copies = store.turns.read(session_id=tree.aa)[:3]
    assert shared == [
        {
            "session_id": tree.aa,
            "shared_tokens": sum(t.context_ids.size + t.generated_ids.size for t in copies),
        }
    ]
