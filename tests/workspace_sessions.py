"""A session with sandbox checkpoints, made as the rollout makes them: a real folder captured by the
real :class:`~dressage.paddock.checkpoints.Checkpointer` (blobs in the store's artifact directory)
and recorded with the changes against the checkpoint before (``tests/store``, ``tests/cli``,
``tests/view`` and the export tests read it back).

Turns of the parent session (``workspace/`` is the captured root):
* 0: ``src/app.py`` (text), ``notes.md``, ``data.bin`` (binary) added;
* 1: ``src/app.py`` modified (one line), ``notes.md`` removed, ``[bold]<b>hostile<i>.txt`` added (its
  content is markup, its name rich and HTML markup, that must stay text), ``big.txt`` added (over the 64 KiB diff cap);
* 2: nothing changed (a checkpoint with no rows);
* 3: ``data.bin`` modified (binary).
A fork of it at turn 2 whose first checkpoint (turn 3) changed ``src/app.py`` against the parent's
checkpoint of turn 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dressage.paddock.checkpoints import Checkpointer, Manifest, change_rows, diff, restore
from dressage.store import EventStore
from dressage.store.sandbox_checkpoints import SandboxCheckpoint
from tests.store.writer_proc import make_turn

APP_V1 = "def main():\n    print('version one')\n\n\nmain()\n"
APP_V2 = "def main():\n    print('version two')\n\n\nmain()\n"
APP_FORK = "def main():\n    print('fork')\n\n\nmain()\n"
HOSTILE_NAME = "[bold]<b>hostile<i>.txt"
HOSTILE_TEXT = "<script>window.pwned = 1</script>\n<img src=x onerror=alert(1)>\n"
BIG_BYTES = 100 * 1024


@dataclass(frozen=True)
class CheckpointedSession:
    """The run and session ids the builder wrote."""

    run: str
    session_id: str
    fork_id: str


def _record(
    store: EventStore, run: str, sid: str, turn: int, m: Manifest, before: Manifest | None, cp: Checkpointer
) -> None:
    _, uri = store.sandbox_checkpoints.put_manifest(m.to_bytes())
    ck = SandboxCheckpoint(sid, turn, m.sha256, uri, m.files, m.total_bytes, cp.last_stats.hashed_bytes)
    store.sandbox_checkpoints.record(run, ck, change_rows(diff(before, m)))


def build_checkpointed_session(store: EventStore, run: str, folder: Path) -> CheckpointedSession:
    """Write the run, the session and its fork described in the module docstring."""
    assert store.artifacts.blobs is not None
    store.runs.create(run, {"checkpoints": {"keep": "all"}})
    sid = store.sessions.open(run, agent="coder", sandbox="bwrap").id
    for i in range(4):
        store.turns.append(run, make_turn(sid, i))
    ws = folder / "ws"
    (ws / "src").mkdir(parents=True)
    cp = Checkpointer(store.artifacts.blobs)
    (ws / "src" / "app.py").write_text(APP_V1)
    (ws / "notes.md").write_text("# notes\n")
    (ws / "data.bin").write_bytes(b"\x00\x01binary" + os.urandom(64))
    m0 = cp.capture({"workspace": ws})
    _record(store, run, sid, 0, m0, None, cp)
    (ws / "src" / "app.py").write_text(APP_V2)
    (ws / "notes.md").unlink()
    (ws / HOSTILE_NAME).write_text(HOSTILE_TEXT)
    (ws / "big.txt").write_text("x" * (BIG_BYTES - 1) + "\n")
    m1 = cp.capture({"workspace": ws})
    _record(store, run, sid, 1, m1, m0, cp)
    m2 = cp.capture({"workspace": ws})
    _record(store, run, sid, 2, m2, m1, cp)
    (ws / "data.bin").write_bytes(b"\x00\x02binary" + os.urandom(80))
    m3 = cp.capture({"workspace": ws})
    _record(store, run, sid, 3, m3, m2, cp)

    fork = store.sessions.open(run, agent="coder", sandbox="bwrap", parent_session_id=sid, fork_turn=2)
    fork_ws = folder / "fork"
    fork_ws.mkdir()
    fork_cp = Checkpointer(store.artifacts.blobs)
    restore(m2.only(("workspace",)), {"workspace": fork_ws}, store.artifacts.blobs)
    (fork_ws / "src" / "app.py").write_text(APP_FORK)
    f3 = fork_cp.capture({"workspace": fork_ws})
    _record(store, run, fork.id, 3, f3, m2, fork_cp)
    return CheckpointedSession(run, sid, fork.id)
