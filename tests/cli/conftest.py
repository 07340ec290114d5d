"""A small, fully known run for the store-command tests (inserted through the EventStore API).

Run ``R`` (the ``run_name`` fixture): sessions ``s1`` (finished, reward 1, 3 turns in 2 segments,
one turn stopped at ``length``, an artifact), ``s2`` (finished, reward 0), ``s3`` (failed with
``context_length_exceeded``), ``s4`` (running, a ``context_overflow`` event). Totals: 6 turns,
22 tokens, 8 trained. A second run ``R-other`` holds one session so ``drop`` can be checked to
leave it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from dressage.store import EventStore, NewTurn


@dataclass
class Populated:
    """What was inserted: names, session ids and every turn record by session."""

    run: str
    other_run: str
    sessions: dict[str, str]
    turns: list[NewTurn] = field(default_factory=list)
    artifact: bytes = b"sandbox archive \x00\x01 bytes"


def _turn(
    sid: str, index: int, ctx: list[int], gen: list[int], lps: list[float], vers: list[int], **kw
) -> NewTurn:
    return NewTurn(
        session_id=sid,
        turn_index=index,
        context_ids=ctx,
        generated_ids=gen,
        logprobs=lps,
        policy_versions=vers,
        **kw,
    )


@pytest.fixture
def populated(store: EventStore, run_name: str) -> Populated:
    """Insert the run described in the module docstring and return what was inserted."""
    sid = {k: f"{run_name}-{k}" for k in ("s1", "s2", "s3", "s4")}
    p = Populated(run=run_name, other_run=f"{run_name}-other", sessions=sid)
    store.runs.create(run_name, {"model": "tiny", "seed": 7})
    store.versions.record(run_name, 0)
    store.versions.record(run_name, 1, "file:///ckpt/1")
    for k in sid:
        store.sessions.open(run_name, session_id=sid[k], agent="whitebox")
    rng = np.random.default_rng(0)
    p.turns = [
        _turn(
            sid["s1"],
            0,
            [248045, 872, 198, 9707],
            [100, 101, 102],
            [-0.005, -0.05, -0.5],
            [0, 0, 0],
            route="create",
            finish_reason="stop",
            latency_ms=12.5,
            routed_experts=rng.integers(0, 200, size=(6, 2, 4)).astype(np.uint8),
        ),
        _turn(
            sid["s1"],
            1,
            [198, 200],
            [103, 104],
            [-2.0, -5.0],
            [0, 1],
            loss_mask=[True, False],
            finish_reason="stop",
            segment_offset=7,
            routed_experts=rng.integers(0, 4000, size=(3, 2, 2)).astype(np.int16),
        ),
        _turn(
            sid["s1"],
            2,
            [5, 6, 7],
            [8],
            [-0.02],
            [1],
            route="create",
            segment_index=1,
            boundary_reason="template_prefix_mismatch",
            finish_reason="length",
        ),
        _turn(sid["s2"], 0, [1, 2], [3, 4], [-0.2, -1.5], [0, 0], finish_reason="stop"),
        _turn(sid["s3"], 0, [1], [2], [-4.0], [1], finish_reason="stop"),
        _turn(sid["s4"], 0, [9], [], [], [], finish_reason=None),
    ]
    for rec in p.turns:
        store.turns.append(run_name, rec)
    store.events.append(run_name, "context_overflow", {"n_tokens": 99}, session_id=sid["s4"])
    store.artifacts.put(run_name, p.artifact, name="sandbox.tar", session_id=sid["s1"])
    store.sessions.finalize(sid["s1"], "finished", reward=1.0, finish_reason="stop")
    store.sessions.finalize(sid["s2"], "finished", reward=0.0, finish_reason="stop")
    store.sessions.finalize(sid["s3"], "failed", finish_reason="context_length_exceeded", error="too long")

    store.runs.create(p.other_run)
    other = store.sessions.open(p.other_run, session_id=f"{run_name}-o1")
    store.turns.append(p.other_run, _turn(other.id, 0, [1, 2, 3], [4], [-0.1], [0]))
    return p
