"""A session with sandbox checkpoints, made as the worker makes them: the turn hook
(:class:`~dressage.rollout.checkpointing.SessionCheckpoints`) checkpoints a real ``local`` sandbox
at each request (the request kept as a blob, the manifest and file blobs in the store's artifact
directory, the changes against the checkpoint before), while the sandbox's commands change its
workspace between requests (``tests/store``, ``tests/cli``, ``tests/view`` and the export tests
read it back).

Turns of the parent session (``workspace/`` is the captured root):
* 0: ``src/app.py`` (text), ``notes.md``, ``data.bin`` (binary) added;
* 1: ``src/app.py`` modified (one line), ``notes.md`` removed, ``[bold]<b>hostile<i>.txt`` added (its
  content is markup and a secret, its name rich and HTML markup: text, redacted), ``big.txt`` added (over the
  64 KiB diff cap);
* 2: nothing changed (a checkpoint with no rows);
* 3: ``data.bin`` modified (binary).
A fork of it at turn 2, its sandbox restored from the parent's checkpoint of turn 2 (as a fork from
a checkpoint starts), whose first checkpoint (turn 3) changed ``src/app.py`` against it.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass
from pathlib import Path

import orjson

from dressage.paddock import SandboxSpec
from dressage.paddock.checkpoints import Manifest, restore
from dressage.paddock.local import LocalProvider
from dressage.proxy.contract import TurnRequest
from dressage.rollout.checkpointing import SessionCheckpoints
from dressage.rollout.config import CheckpointsConfig
from dressage.store import EventStore
from dressage.store.records import Run
from tests.store.writer_proc import make_turn

APP_V1 = "def main():\n    print('version one')\n\n\nmain()\n"
APP_V2 = "def main():\n    print('version two')\n\n\nmain()\n"
APP_FORK = "def main():\n    print('fork')\n\n\nmain()\n"
HOSTILE_NAME = "[bold]<b>hostile<i>.txt"
SECRET = "sk-live0123456789abcdefXYZ"
HOSTILE_TEXT = f"<script>window.pwned = 1</script>\n<img src=x onerror=alert(1)>\napi_key={SECRET}\n"
BIG_BYTES = 100 * 1024


@dataclass(frozen=True)
class CheckpointedSession:
    """The run and session ids the builder wrote."""

    run: str
    session_id: str
    fork_id: str


def _request(turn: int) -> TurnRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": f"step {turn}"}]}
    return TurnRequest(turn, "chat", orjson.dumps(body), f"{turn:064x}")


async def _session(
    store: EventStore, run: Run, sid: str, base: Manifest | None, steps: dict[int, list[str]]
) -> None:
    """Run the shell ``steps`` of each turn in a fresh local sandbox (restored from ``base``), then
    checkpoint it at that turn's request as the worker's hook does."""
    assert store.artifacts.blobs is not None
    sandbox = await LocalProvider().create(sid, SandboxSpec(provider="local"))
    try:
        if base is not None:
            await sandbox.restore_checkpoint(base, store.artifacts.blobs)
        hook = await SessionCheckpoints.for_session(store, run, sid, sandbox, CheckpointsConfig(), [], base)
        for turn, commands in sorted(steps.items()):
            for cmd in commands:
                result = await sandbox.exec(cmd)
                assert result.exit_code == 0, (cmd, result)
            await hook(_request(turn))
    finally:
        await sandbox.terminate()


def build_checkpointed_session(store: EventStore, run: str, folder: Path) -> CheckpointedSession:
    """Write the run, the session and its fork described in the module docstring; ``folder`` holds
    the parent's workspace as it ends (``folder/ws``), to compare restores with."""
    r = store.runs.create(run, {"checkpoints": {"keep": "all"}})
    sid = store.sessions.open(run, agent="coder", sandbox="local").id
    for i in range(4):
        store.turns.append(run, make_turn(sid, i))
    hostile = shlex.quote(HOSTILE_NAME)
    steps = {
        0: [
            f"mkdir src && printf %s {shlex.quote(APP_V1)} > src/app.py",
            "printf '# notes\\n' > notes.md",
            "printf '\\000\\001binary' > data.bin && head -c 64 /dev/urandom >> data.bin",
        ],
        1: [
            f"printf %s {shlex.quote(APP_V2)} > src/app.py && rm notes.md",
            f"printf %s {shlex.quote(HOSTILE_TEXT)} > {hostile}",
            f"head -c {BIG_BYTES - 1} /dev/zero | tr '\\0' x > big.txt && echo >> big.txt",
        ],
        2: [],
        3: ["printf '\\000\\002binary' > data.bin && head -c 80 /dev/urandom >> data.bin"],
    }
    asyncio.run(_session(store, r, sid, None, steps))
    last = store.sandbox_checkpoints.get(sid, 3)
    assert last is not None
    final = Manifest.from_bytes(store.sandbox_checkpoints.read_manifest(last))
    assert store.artifacts.blobs is not None
    (folder / "ws").mkdir(parents=True)
    restore(final, {"workspace": folder / "ws"}, store.artifacts.blobs)

    at_fork = store.sandbox_checkpoints.get(sid, 2)
    assert at_fork is not None
    base = Manifest.from_bytes(store.sandbox_checkpoints.read_manifest(at_fork))
    fork = store.sessions.open(run, agent="coder", sandbox="local", parent_session_id=sid, fork_turn=2)
    asyncio.run(_session(store, r, fork.id, base, {3: [f"printf %s {shlex.quote(APP_FORK)} > src/app.py"]}))
    return CheckpointedSession(run, sid, fork.id)
