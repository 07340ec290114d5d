"""What checkpoints changed, for people (SQLite and PostgreSQL): the ``workspace_changes`` view's
rows per turn, and :func:`~dressage.paddock.workspace_diffs.turn_diffs`' unified diffs of text
files (a binary file and one over the cap are described, not diffed; a fork's first checkpoint is
diffed against its parent's at the fork turn)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from dressage.paddock.workspace_diffs import DiffCaps, session_changes, turn_diffs
from dressage.store import EventStore
from tests.workspace_sessions import BIG_BYTES, HOSTILE_NAME, HOSTILE_TEXT, build_checkpointed_session


def test_workspace_changes_view_lists_each_turns_paths(
    store: EventStore, run_name: str, tmp_path: Path
) -> None:
    built = build_checkpointed_session(store, run_name, tmp_path)
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT run_name, turn_index, path, change, kind, size FROM workspace_changes "
                "WHERE session_id = :s ORDER BY turn_index, path"
            ),
            {"s": built.session_id},
        ).all()
    by_turn: dict[int, dict[str, str]] = {}
    for run, turn, path, change, _kind, _size in rows:
        assert run == run_name
        by_turn.setdefault(turn, {})[path] = change
    assert by_turn[0] == {
        "workspace": "added",
        "workspace/src": "added",
        "workspace/src/app.py": "added",
        "workspace/notes.md": "added",
        "workspace/data.bin": "added",
    }
    assert by_turn[1] == {
        "workspace/src/app.py": "modified",
        "workspace/notes.md": "removed",
        f"workspace/{HOSTILE_NAME}": "added",
        "workspace/big.txt": "added",
    }
    assert 2 not in by_turn  # nothing changed: no rows, yet a checkpoint
    assert by_turn[3] == {"workspace/data.bin": "modified"}
    listed = session_changes(store, built.session_id)
    assert [t.turn_index for t in listed] == [0, 1, 2, 3]
    assert listed[2].files == []
    assert listed[1].counts() == {"added": 2, "modified": 1, "removed": 1}


def test_turn_diffs_show_text_and_describe_the_rest(store: EventStore, run_name: str, tmp_path: Path) -> None:
    built = build_checkpointed_session(store, run_name, tmp_path)
    turn = turn_diffs(store, built.session_id, 1)
    assert turn is not None
    files = {f.path: f for f in turn.files}
    app = files["workspace/src/app.py"]
    assert app.diff is not None and app.note is None
    assert app.diff[:2] == ["--- a/workspace/src/app.py", "+++ b/workspace/src/app.py"]
    assert "-    print('version one')" in app.diff and "+    print('version two')" in app.diff
    removed = files["workspace/notes.md"]
    assert removed.diff is not None and "-# notes" in removed.diff and removed.diff[1] == "+++ /dev/null"
    hostile = files[f"workspace/{HOSTILE_NAME}"]
    assert hostile.diff is not None and hostile.diff[0] == "--- /dev/null"
    assert [
        x[1:] for x in hostile.diff if x.startswith("+") and not x.startswith("+++")
    ] == HOSTILE_TEXT.splitlines()
    big = files["workspace/big.txt"]
    assert big.diff is None and big.note == f"{BIG_BYTES} bytes, over the 64 KiB a diff shows"

    binary = turn_diffs(store, built.session_id, 3)
    assert binary is not None
    (data,) = binary.files
    assert data.diff is None and data.note == f"binary, {8 + 80} bytes"
    assert turn_diffs(store, built.session_id, 7) is None


def test_total_cap_and_fork_base(store: EventStore, run_name: str, tmp_path: Path) -> None:
    built = build_checkpointed_session(store, run_name, tmp_path)
    capped = turn_diffs(store, built.session_id, 1, DiffCaps(max_total_bytes=70))
    assert capped is not None
    notes = {f.path: f.note for f in capped.files}
    left_out = [p for p, n in notes.items() if n is not None and n.startswith("left out")]
    assert left_out, notes  # the cap stops reading once 70 bytes are used
    assert capped.read_bytes <= 70

    fork = turn_diffs(store, built.fork_id, 3)
    assert fork is not None
    (app,) = fork.files
    assert app.change == "modified" and app.diff is not None
    assert "-    print('version two')" in app.diff and "+    print('fork')" in app.diff
