"""Sandbox checkpoints in the log (SQLite and PostgreSQL): a captured tree's manifest and blobs,
restored byte for byte; unchanged files not hashed again; ``workspace_changes`` per turn; idempotent
records; retention."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from dressage.errors import IdempotencyConflictError
from dressage.paddock.checkpoints import (
    Caps,
    Checkpointer,
    CheckpointTooLarge,
    Manifest,
    change_rows,
    diff,
    restore,
)
from dressage.store import EventStore
from dressage.store.db import downgrade, upgrade
from dressage.store.sandbox_checkpoints import SandboxCheckpoint
from tests.conftest import create_pg_database
from tests.store.migration_checks import select_rows, sqlite_database


def _tree(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("print('a')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "empty").mkdir()
    os.chmod(root / "empty", 0o750)
    (root / "link").symlink_to("src/a.py")
    (root / "outside").symlink_to("/etc/passwd")  # stored as a link, never followed
    (root / "big.bin").write_bytes(os.urandom(100_000))


def _record(
    store: EventStore, run: str, sid: str, turn: int, m: Manifest, before: Manifest | None, cp: Checkpointer
) -> SandboxCheckpoint:
    _, uri = store.sandbox_checkpoints.put_manifest(m.to_bytes())
    ck = SandboxCheckpoint(sid, turn, m.sha256, uri, m.files, m.total_bytes, cp.last_stats.hashed_bytes, 0)
    return store.sandbox_checkpoints.record(run, ck, change_rows(diff(before, m)))


def _snapshot(root: Path) -> dict[str, tuple[str, int, bytes | str | None]]:
    out: dict[str, tuple[str, int, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), None)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_bytes())
    return out


def test_capture_record_restore_and_changes(store: EventStore, run_name: str, tmp_path: Path) -> None:
    store.runs.create(run_name)
    sid = store.sessions.open(run_name).id
    ws = tmp_path / "ws"
    ws.mkdir()
    _tree(ws)
    assert store.artifacts.blobs is not None
    cp = Checkpointer(store.artifacts.blobs)
    m0 = cp.capture({"workspace": ws})
    assert cp.last_stats.hashed == 3
    _record(store, run_name, sid, 0, m0, None, cp)

    m1 = cp.capture({"workspace": ws})  # nothing changed: same identity, nothing read again
    assert (m1.sha256, cp.last_stats.hashed) == (m0.sha256, 0)
    _record(store, run_name, sid, 1, m1, m0, cp)

    (ws / "src" / "a.py").write_text("print('b')\n")
    (ws / "big.bin").unlink()
    (ws / "new.txt").write_text("new")
    m2 = cp.capture({"workspace": ws})
    assert cp.last_stats.hashed == 2
    ck2 = _record(store, run_name, sid, 2, m2, m1, cp)
    assert ck2.manifest_sha256 == m2.sha256 != m1.sha256

    with store.db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT turn_index, path, change FROM workspace_changes WHERE session_id = :s ORDER BY turn_index, path"
            ),
            {"s": sid},
        ).all()
    by_turn = {(r[0], r[1]): r[2] for r in rows}
    assert not [k for k in by_turn if k[0] == 1]  # an unchanged tree has no row
    assert by_turn[(2, "workspace/src/a.py")] == "modified"
    assert by_turn[(2, "workspace/big.bin")] == "removed"
    assert by_turn[(2, "workspace/new.txt")] == "added"
    assert by_turn[(0, "workspace/outside")] == "added"
    assert len([k for k in by_turn if k[0] == 2]) == 3

    # Restore turn 0 into a fresh folder that holds other files: byte for byte, modes and links.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "seeded.txt").write_text("seed")
    stored = store.sandbox_checkpoints.get(sid, 0)
    assert stored is not None
    manifest = Manifest.from_bytes(store.sandbox_checkpoints.read_manifest(stored))
    assert manifest.sha256 == m0.sha256
    restore(manifest, {"workspace": fresh}, store.artifacts.blobs)
    restored = _snapshot(fresh)
    assert "seeded.txt" not in restored
    assert restored["run.sh"] == ("file", 0o755, b"#!/bin/sh\necho hi\n")
    assert restored["empty"] == ("dir", 0o750, None)
    assert restored["outside"] == ("link", 0, "/etc/passwd")
    assert Checkpointer(store.artifacts.blobs).capture({"workspace": fresh}).sha256 == m0.sha256


def test_record_is_idempotent_and_refuses_other_content(
    store: EventStore, run_name: str, tmp_path: Path
) -> None:
    store.runs.create(run_name)
    sid = store.sessions.open(run_name).id
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("a")
    assert store.artifacts.blobs is not None
    cp = Checkpointer(store.artifacts.blobs)
    m = cp.capture({"workspace": ws})
    first = _record(store, run_name, sid, 0, m, None, cp)
    assert _record(store, run_name, sid, 0, m, None, cp) == first
    (ws / "a").write_text("b")
    with pytest.raises(IdempotencyConflictError):
        _record(store, run_name, sid, 0, cp.capture({"workspace": ws}), None, cp)
    for turn in (1, 2, 3):
        _record(store, run_name, sid, turn, m, None, cp)
    assert store.sandbox_checkpoints.prune(run_name, sid, [0, 1, 9], "keep last:2") == [0, 1]
    assert [c.turn_index for c in store.sandbox_checkpoints.by_session(sid)] == [2, 3]
    pruned = [e for e in store.events.read(run_name, kinds=("checkpoints_pruned",)) if e.session_id == sid]
    assert [e.payload["turns"] for e in pruned] == [[0, 1]]


def test_caps_refuse_a_tree_too_large(store: EventStore, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_bytes(b"x" * 2000)
    assert store.artifacts.blobs is not None
    with pytest.raises(CheckpointTooLarge, match="max_file_mb"):
        Checkpointer(store.artifacts.blobs, Caps(max_file_bytes=1000)).capture({"workspace": ws})
    (ws / "b").write_bytes(b"x" * 2000)
    with pytest.raises(CheckpointTooLarge, match="max_total_mb"):
        Checkpointer(store.artifacts.blobs, Caps(max_total_bytes=3000)).capture({"workspace": ws})


def _migration_roundtrip(url: str) -> None:
    assert select_rows(url, "SELECT COUNT(*) FROM workspace_changes") == [(0,)]
    downgrade(url, "0009")
    with pytest.raises((OperationalError, ProgrammingError)):  # no such view (SQLite, PostgreSQL)
        select_rows(url, "SELECT COUNT(*) FROM workspace_changes")
    upgrade(url)
    assert select_rows(url, "SELECT COUNT(*) FROM sandbox_checkpoints") == [(0,)]


def test_migration_0010_round_trip_on_sqlite(tmp_path: Path) -> None:
    _migration_roundtrip(sqlite_database(tmp_path, "ck.db"))


def test_migration_0010_round_trip_on_postgresql() -> None:
    _migration_roundtrip(create_pg_database(f"dressage_test_ck_{os.getpid()}"))
