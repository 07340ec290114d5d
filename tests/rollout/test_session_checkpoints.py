"""The worker's turn hook on a real sandbox and log (SQLite and PostgreSQL): one checkpoint per live
request with the request kept, retention applied as it goes, a tree over a cap recorded as
``checkpoint_skipped``, and a start loaded back (manifest, resume point) or refused with why."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dressage.agents import AnswerAgent, CodingAgent
from dressage.paddock import SandboxSpec
from dressage.paddock.local import LocalProvider
from dressage.proxy.contract import TurnRequest
from dressage.rollout.checkpointing import SessionCheckpoints, StartPoint, load_start
from dressage.rollout.config import CheckpointsConfig
from dressage.store import EventStore, NewTurn

pytestmark = pytest.mark.anyio


def _request(turn: int) -> TurnRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": f"step {turn}"}]}
    return TurnRequest(turn, "chat", orjson.dumps(body), f"{turn:064x}")


async def test_hook_records_retains_and_skips(store: EventStore, run_name: str, tmp_path: Path) -> None:
    run = store.runs.create(run_name)
    sid = store.sessions.open(run_name).id
    sandbox = await LocalProvider().create(sid, SandboxSpec(provider="local", files={"a.txt": "a"}))
    try:
        cfg = CheckpointsConfig(keep="last:2", max_file_mb=1)
        hook = await SessionCheckpoints.for_session(store, run, sid, sandbox, cfg, [])
        for turn in range(4):
            await sandbox.write_file(f"f{turn}.txt", str(turn))
            await hook(_request(turn))
            await hook(_request(turn))  # a second request at the same boundary: one checkpoint
        assert [c.turn_index for c in store.sandbox_checkpoints.by_session(sid)] == [2, 3]
        pruned = store.events.read(run_name, kinds=("checkpoints_pruned",))
        assert [e.payload["turns"] for e in pruned] == [[0], [1]]
        changes = store.sandbox_checkpoints.changes(sid, 3)
        assert [(c.path, c.change) for c in changes] == [
            ("workspace/f3.txt", "added")
        ]  # a folder is its mode

        await sandbox.write_file("big.bin", b"x" * (2 * 1024 * 1024))
        await hook(_request(4))
        assert store.sandbox_checkpoints.get(sid, 4) is None
        (skipped,) = store.events.read(run_name, kinds=("checkpoint_skipped",))
        assert skipped.payload["turn_index"] == 4 and "max_file_mb" in skipped.payload["reason"]

        start = load_start(store, sid, 3, CodingAgent())
        assert isinstance(start, StartPoint)
        assert start.point.request["messages"] == [{"role": "user", "content": "step 3"}]
        assert start.manifest.sha256 == start.checkpoint.manifest_sha256
        assert "workspace/f3.txt" in start.manifest.by_path()
        assert (
            load_start(store, sid, 4, CodingAgent()) == f"session {sid} has no sandbox checkpoint at turn 4"
        )
        assert load_start(store, sid, 3, AnswerAgent()) == "agent 'answer' has no resume entry point"

        # A fork at 4 shares turn 3 with its parent: a fork of it at 3 starts from the parent's checkpoint.
        for turn in range(4):
            store.turns.append(run_name, NewTurn(sid, turn, [1, 2, 3 + turn], [7], [-0.5], [0]))
        child = store.sessions.open(run_name, parent_session_id=sid, fork_turn=4).id
        shared = load_start(store, child, 3, CodingAgent())
        assert isinstance(shared, StartPoint) and shared.checkpoint == start.checkpoint
        assert shared.point.source == f"session {sid} turn 3"
        assert (
            load_start(store, child, 1, CodingAgent())
            == f"session {child} has no sandbox checkpoint at turn 1"
        )
    finally:
        await sandbox.terminate()
