"""What a session's sandbox checkpoints changed, turn by turn, for people (the viewer, ``show --files``).

Each checkpoint lists the paths it added, modified or removed against the checkpoint before it (the
``workspace_changes`` view, :mod:`dressage.store.sandbox_checkpoints`). This module reads those
lists (:func:`session_changes`) and, for one turn (:func:`turn_diffs`), the unified diff of each
changed text file: the new bytes are the blob the turn's manifest names, the old bytes the blob of
the same path in the checkpoint before it (the session's latest earlier checkpoint; for a fork's
first, its ancestor's at the fork turn, as :mod:`dressage.rollout.checkpointing` restores it).

File contents are the agent's, so untrusted: callers show them as text only (the viewer escapes,
the CLI prints without markup). Diffs are capped (:class:`DiffCaps`: per file and per turn); a
binary file (a NUL byte, or not UTF-8) is described as ``binary, N bytes``, never decoded.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from dressage.errors import UnknownSessionError
from dressage.paddock.checkpoints import Entry, Manifest
from dressage.store import EventStore
from dressage.store.sandbox_checkpoints import CheckpointChange, SandboxCheckpoint

KIB = 1024


@dataclass(frozen=True)
class DiffCaps:
    """How much file content a turn's diffs may read: per file (either side) and in all."""

    max_file_bytes: int = 64 * KIB
    max_total_bytes: int = 1024 * KIB


@dataclass(frozen=True)
class FileChange:
    """One changed path of a turn; ``diff`` (unified diff lines) or ``note`` says what changed."""

    path: str
    change: str
    kind: str | None
    size: int | None
    diff: list[str] | None = None
    note: str | None = None


@dataclass(frozen=True)
class TurnChanges:
    """The paths the checkpoint of ``turn_index`` changed (with diffs when asked for)."""

    turn_index: int
    manifest_sha256: str
    files: list[FileChange] = field(default_factory=list)
    read_bytes: int = 0
    """The file bytes its diffs read (what counts against :attr:`DiffCaps.max_total_bytes`)."""

    def counts(self) -> dict[str, int]:
        """How many paths were added, modified and removed."""
        out = {"added": 0, "modified": 0, "removed": 0}
        for f in self.files:
            out[f.change] = out.get(f.change, 0) + 1
        return out


def session_changes(store: EventStore, session_id: str) -> list[TurnChanges]:
    """Every checkpoint of ``session_id`` (by turn) with the paths it changed (no diffs)."""
    store.sessions.get(session_id)  # an unknown session is an error, not an empty list
    repo = store.sandbox_checkpoints
    return [
        TurnChanges(
            c.turn_index, c.manifest_sha256, [_plain(x) for x in repo.changes(session_id, c.turn_index)]
        )
        for c in repo.by_session(session_id)
    ]


def turn_diffs(
    store: EventStore, session_id: str, turn_index: int, caps: DiffCaps | None = None
) -> TurnChanges | None:
    """The paths the checkpoint of ``turn_index`` changed, each text file with its unified diff
    against the checkpoint before (None: the session has no checkpoint at that turn)."""
    caps = caps or DiffCaps()
    repo = store.sandbox_checkpoints
    found = repo.get(session_id, turn_index)
    if found is None:
        return None
    after = Manifest.from_bytes(repo.read_manifest(found))
    earlier = _checkpoint_before(store, session_id, turn_index)
    before = None if earlier is None else Manifest.from_bytes(repo.read_manifest(earlier))
    reader = _BlobReader(store, caps)
    old_entries = {} if before is None else before.by_path()
    new_entries = after.by_path()
    files = [
        _with_diff(reader, c, (old_entries.get(c.path), before), (new_entries.get(c.path), after))
        for c in repo.changes(session_id, turn_index)
    ]
    return TurnChanges(turn_index, found.manifest_sha256, files, reader.used)


def _plain(c: CheckpointChange) -> FileChange:
    return FileChange(c.path, c.change, c.kind, c.size)


def _checkpoint_before(store: EventStore, session_id: str, turn_index: int) -> SandboxCheckpoint | None:
    """The checkpoint ``turn_index``'s changes were taken against: the session's latest earlier one,
    else (a fork) the one its ancestors hold at its fork turn."""
    repo = store.sandbox_checkpoints
    earlier = [c for c in repo.by_session(session_id) if c.turn_index < turn_index]
    if earlier:
        return earlier[-1]
    session = store.sessions.get(session_id)
    turn = session.fork_turn
    while session.parent_session_id is not None and turn is not None:
        try:
            session = store.sessions.get(session.parent_session_id)
        except UnknownSessionError:  # its parent's run was dropped
            return None
        found = repo.get(session.id, turn)
        if found is not None:
            return found
        if session.fork_turn is None or turn >= session.fork_turn:
            return None
    return None


class _BlobReader:
    """Reads the blobs of one turn's diffs within the caps."""

    def __init__(self, store: EventStore, caps: DiffCaps) -> None:
        self.store, self.caps, self.used = store, caps, 0

    def read(self, manifest: Manifest, entry: Entry) -> bytes | str:
        """The entry's bytes, or why they are not read (a note)."""
        if entry.size > self.caps.max_file_bytes:
            return f"{entry.size} bytes, over the {self.caps.max_file_bytes // KIB} KiB a diff shows"
        if self.used + entry.size > self.caps.max_total_bytes:
            return f"left out: this turn's diffs reached {self.caps.max_total_bytes // KIB} KiB"
        uri = manifest.blobs.get(entry.sha256 or "")
        blobs = self.store.artifacts.blobs
        if uri is None or blobs is None:
            return "its content is not in the artifact store"
        self.used += entry.size
        return blobs.get(uri)


def _describe(entry: Entry | None) -> str | None:
    """What a non-file entry is, in words (None for a file)."""
    if entry is None or entry.kind == "file":
        return None
    if entry.target is not None:
        return f"{entry.kind} -> {entry.target}"
    return f"{entry.kind}, mode {entry.mode:o}"


def _with_diff(
    reader: _BlobReader,
    c: CheckpointChange,
    was: tuple[Entry | None, Manifest | None],
    now: tuple[Entry | None, Manifest],
) -> FileChange:
    """``c`` with its diff (a file on the side(s) it has) or a note saying what it is; ``was`` and
    ``now``: the path's entry in the checkpoint before and in this one, with their manifests."""
    (old, before), (new, after) = was, now
    new = new if c.change != "removed" else None
    old = old if before is not None and c.change != "added" else None
    sides: list[bytes | str] = []
    for manifest, entry, needed in ((before, old, c.change != "added"), (after, new, c.change != "removed")):
        if not needed:
            sides.append(b"")
        elif entry is None or manifest is None:
            sides.append(_describe(new) or "the checkpoint before is not in the log")
        elif entry.kind != "file":
            sides.append(_describe(entry) or entry.kind)
        else:
            sides.append(reader.read(manifest, entry))
    a, b = sides
    if not isinstance(a, bytes):
        return FileChange(c.path, c.change, c.kind, c.size, note=a)
    if not isinstance(b, bytes):
        return FileChange(c.path, c.change, c.kind, c.size, note=b)
    if not (is_text(a) and is_text(b)):
        size = len(a) if c.change == "removed" else len(b)
        return FileChange(c.path, c.change, c.kind, c.size, note=f"binary, {size} bytes")
    lines = difflib.unified_diff(
        a.decode().splitlines(),
        b.decode().splitlines(),
        fromfile="/dev/null" if c.change == "added" else f"a/{c.path}",
        tofile="/dev/null" if c.change == "removed" else f"b/{c.path}",
        lineterm="",
    )
    return FileChange(c.path, c.change, c.kind, c.size, diff=list(lines))


def is_text(data: bytes) -> bool:
    """Whether ``data`` reads as text: UTF-8 with no NUL byte (the viewer shows it, a diff compares it)."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
