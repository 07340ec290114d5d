"""``dressage-worker fork``: a 6-turn tool-loop session forked at turn 3 into 4 branches.

Real worker processes, a coding agent in bwrap sandboxes, a scripted engine that counts its
requests, on SQLite and PostgreSQL. Every child's turns 0-2 are the parent's id for id (context,
generated ids, logprobs, loss mask, policy versions, placement), copied without an engine request;
each child's sandbox re-ran the parent's commands (the hashes its tools print before turn 3 are
the parent's); turn 3 is live with the branch's own seed, so the children diverge there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from dressage.store.db import make_engine
from dressage.tito import get_profile
from tests.rollout.conftest import open_store, requires_bwrap
from tests.rollout.fork_harness import (
    SEED_STEP,
    TURNS,
    ForkScript,
    finish,
    log_hash_after,
    record_parent,
    start_fork,
    turn_rows,
)
from tests.scripted_engine import ScriptedEngine

pytestmark = requires_bwrap
BRANCHES = 4
SEED = 100


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedEngine, ForkScript]]:
    script = ForkScript()
    with ScriptedEngine(script).running() as eng:
        yield eng, script


def _tree(db_url: str, root: str) -> list[tuple[object, ...]]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT session_id, parent_session_id, fork_turn, depth, root_session_id, shared_tokens "
                    "FROM session_tree WHERE root_session_id = :root ORDER BY depth, session_id"
                ),
                {"root": root},
            )
            return [tuple(r) for r in rows]
    finally:
        engine.dispose()


def test_fork_at_turn_3_into_4_branches(
    tmp_path: Path, any_db_url: str, scripted: tuple[ScriptedEngine, ForkScript]
) -> None:
    eng, script = scripted
    run, parent_id = record_parent(tmp_path, any_db_url, eng.url)
    assert [step for step, _ in script.requests("parent")] == list(range(TURNS))

    script.phase = "fork"
    args = [parent_id, "--at-turn", str(SEED_STEP), "--branches", str(BRANCHES), "--seed", str(SEED)]
    out = finish(start_fork([*args, "--database-url", any_db_url], tmp_path / "home"))
    assert f"{BRANCHES} branches" in out

    # The engine generated nothing for the shared turns: one request per branch and live step.
    requests = script.requests("fork")
    assert all(step >= SEED_STEP for step, _ in requests)
    assert sorted(seed for step, seed in requests if step == SEED_STEP) == [SEED + i for i in range(BRANCHES)]
    assert len(requests) == BRANCHES * (TURNS - SEED_STEP)

    store = open_store(any_db_url, tmp_path / "home")
    try:
        parent = turn_rows(store, parent_id)
        parent_turns = store.turns.read(session_id=parent_id, with_experts=False)
        children = [s for s in store.sessions.list(run) if s.parent_session_id == parent_id]
        assert len(children) == BRANCHES
        tok = get_profile("qwen3.5").tokenizer
        live_replies = set()
        for child in children:
            assert (child.status, child.fork_turn, child.task_id) == ("finished", SEED_STEP, None)
            rows = turn_rows(store, child.id)
            assert len(rows) == TURNS
            assert rows[:SEED_STEP] == parent[:SEED_STEP]  # id for id, placement included
            turns = store.turns.read(session_id=child.id, with_experts=False)
            assert [t.info.get("replayed_from") for t in turns[:SEED_STEP]] == [
                t.id for t in parent_turns[:SEED_STEP]
            ]
            assert all("replayed_from" not in t.info for t in turns[SEED_STEP:])
            # Before turn 3 the child's workspace is the parent's: turn 3's new context is the output
            # of the child's own sandbox (turn 3 is live), and it prints the parent's file hashes.
            assert rows[SEED_STEP][6] == parent[SEED_STEP][6]
            assert log_hash_after(SEED_STEP - 1) in tok.decode(rows[SEED_STEP][6])
            seed = child.info["fork"]["seed"]
            assert f"seed{seed}" in tok.decode(rows[SEED_STEP][7])
            live_replies.add(tuple(rows[SEED_STEP][7]))
        assert len(live_replies) == BRANCHES  # different seeds: the branches diverge at turn 3
    finally:
        store.close()

    tree = _tree(any_db_url, parent_id)
    assert tree[0][:5] == (parent_id, None, None, 0, parent_id)
    shared = sum(len(r[6]) + len(r[7]) for r in parent[:SEED_STEP])
    assert sorted(r[:6] for r in tree[1:]) == sorted(
        (c.id, parent_id, SEED_STEP, 1, parent_id, shared) for c in children
    )

    # A fork of a fork: the grandchild shares the child's first 5 turns (3 of them the root's).
    script.phase, child = "grandchild", children[0]
    finish(
        start_fork(
            [child.id, "--at-turn", "5", "--seed", "7", "--database-url", any_db_url], tmp_path / "home"
        )
    )
    assert script.requests("grandchild") == [(5, 7)]
    store = open_store(any_db_url, tmp_path / "home")
    try:
        (grandchild,) = store.sessions.children(child.id)
        assert (grandchild.status, grandchild.fork_turn, grandchild.info["fork"]["task_id"]) == (
            "finished", 5, child.info["fork"]["task_id"],
        )  # fmt: skip
        assert turn_rows(store, grandchild.id)[:5] == turn_rows(store, child.id)[:5]
    finally:
        store.close()
    assert _tree(any_db_url, parent_id)[-1][:5] == (grandchild.id, child.id, 5, 2, parent_id)
