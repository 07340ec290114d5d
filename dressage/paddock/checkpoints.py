"""Sandbox checkpoints: a sandbox's writable state as a content-addressed manifest plus blobs.

A checkpoint is taken at a turn boundary (a request of the agent reaching the proxy: its tools have
run, it waits for the model) and restored into a fresh sandbox to start a fork or a take-over at
that turn without re-running a tool (docs/rollout.md, "Checkpoints").

What is captured is what the provider names as its writable state
(:meth:`~dressage.paddock.base.Sandbox.writable_roots`): for ``bwrap`` and ``local`` the workspace,
which is also the agent's ``HOME``; ``/tmp`` of a ``bwrap`` command is a tmpfs that dies with the
command, so nothing there outlives a turn. Each root is walked without following links; the
manifest lists every entry as ``(path, kind, mode, size, sha256 | target)``:

* ``file``: its bytes go to the blob store once (named by sha256, so an unchanged file of a later
  turn, or of another session, costs nothing); ``mode`` is its permission bits;
* ``dir``: its permission bits (empty folders survive a restore);
* ``symlink``: its target, stored as written (never followed, never resolved);
* anything else (sockets, FIFOs, devices) is left out and counted in ``skipped``.

A root named in ``overlays`` (:meth:`Checkpointer.capture`; the ``image`` provider's overlay upper
folder) is read as overlayfs wrote it: its root entry is ``overlay`` (``target``: what it lies
over, the image's digest); a whiteout (the 0/0 character device this kernel's unprivileged overlay
makes for a deleted image file) is a ``deleted`` entry; a folder marked ``overlay.opaque`` (made
anew where the image had one: none of the image's children show through) is ``opaque_dir``. A
redirect or metacopy xattr (features such mounts do not enable) is refused. Such a manifest is
applied by its sandbox (:meth:`~dressage.paddock.base.Sandbox.restore_checkpoint`), never by
:func:`restore`. A ``snapshot`` entry (``target``: a provider's snapshot id, E2B's) stands for the
whole machine's state kept by the provider.

The manifest's identity (:attr:`Manifest.sha256`) is the sha256 of its entries' canonical JSON:
an unchanged tree has the same hash, and its manifest blob is stored once. Modification times and
owners are not part of it (a restored file is byte- and mode-equal, owned by the new sandbox).

:class:`Checkpointer` keeps one session's stat cache (size, mtime, ctime, inode by path): a file
whose stat is unchanged since the last capture is not read or hashed again, so a capture costs one
``lstat`` per entry plus reading what changed. Caps (``max_file_bytes``, ``max_total_bytes``) bound
what a checkpoint holds; a tree over them raises :class:`CheckpointTooLarge` and the turn has no
checkpoint (forks from it fall back to replay, saying why).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from dressage.errors import SandboxError
from dressage.store.artifacts import BlobStore
from dressage.store.sandbox_checkpoints import CheckpointChange

MANIFEST_VERSION = 1
"""The manifest format's version, in every stored manifest."""

HOST_KINDS = ("file", "dir", "symlink")
"""The entry kinds :func:`restore` writes into host folders."""
OVERLAY_KINDS = ("overlay", "deleted", "opaque_dir")
"""The entry kinds of an overlay upper folder's root (module docstring)."""
_TARGETED = ("symlink", "overlay", "snapshot")
_OVERLAY_XATTRS = ("user.overlay.", "trusted.overlay.")


class CheckpointError(SandboxError):
    """A checkpoint could not be taken or restored."""


class CheckpointTooLarge(CheckpointError):
    """The sandbox's writable state is over a checkpoint cap: this turn has no checkpoint."""


@dataclass(frozen=True)
class Entry:
    """One manifest entry: ``path`` is ``<root name>/<relative path>`` (``workspace/src/a.py``)."""

    path: str
    kind: str
    """``file``, ``dir`` or ``symlink``; ``overlay``, ``deleted``, ``opaque_dir`` or ``snapshot``
    (the module docstring)."""
    mode: int = 0
    size: int = 0
    sha256: str | None = None
    target: str | None = None

    def as_json(self) -> dict[str, object]:
        """The entry as stored (keys with no value left out)."""
        out: dict[str, object] = {"path": self.path, "kind": self.kind, "mode": self.mode}
        if self.kind == "file":
            out.update(size=self.size, sha256=self.sha256)
        if self.kind in _TARGETED:
            out["target"] = self.target
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Entry:
        """The entry of a stored manifest."""
        return cls(
            path=str(raw["path"]),
            kind=str(raw["kind"]),
            mode=int(raw.get("mode", 0)),  # type: ignore[call-overload]
            size=int(raw.get("size", 0)),  # type: ignore[call-overload]
            sha256=None if raw.get("sha256") is None else str(raw["sha256"]),
            target=None if raw.get("target") is None else str(raw["target"]),
        )


@dataclass(frozen=True)
class Manifest:
    """A sandbox's writable state: its entries by path, the blob URI of each file's content."""

    roots: tuple[str, ...]
    entries: tuple[Entry, ...]
    blobs: Mapping[str, str] = field(default_factory=dict)
    """sha256 -> the URI its bytes are stored at."""
    skipped: int = 0

    @property
    def sha256(self) -> str:
        """The manifest's identity: sha256 of its roots and entries (not of blob URIs)."""
        body = {"roots": list(self.roots), "entries": [e.as_json() for e in self.entries]}
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    @property
    def files(self) -> int:
        """How many regular files it holds."""
        return sum(1 for e in self.entries if e.kind == "file")

    @property
    def total_bytes(self) -> int:
        """The bytes of its files together."""
        return sum(e.size for e in self.entries if e.kind == "file")

    def by_path(self) -> dict[str, Entry]:
        """The entries by path."""
        return {e.path: e for e in self.entries}

    def only(self, names: tuple[str, ...]) -> Manifest:
        """The part of this manifest under the roots ``names`` (those it has)."""
        roots = tuple(r for r in self.roots if r in names)
        entries = tuple(e for e in self.entries if e.path.partition("/")[0] in roots)
        shas = {e.sha256 for e in entries if e.sha256 is not None}
        blobs = {k: v for k, v in self.blobs.items() if k in shas}
        return Manifest(roots, entries, blobs, self.skipped)

    def to_bytes(self) -> bytes:
        """The stored form (canonical JSON)."""
        return orjson.dumps(
            {
                "version": MANIFEST_VERSION,
                "roots": list(self.roots),
                "entries": [e.as_json() for e in self.entries],
                "blobs": dict(sorted(self.blobs.items())),
                "skipped": self.skipped,
            },
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """A stored manifest; refuses another format version."""
        raw = orjson.loads(data)
        if raw.get("version") != MANIFEST_VERSION:
            raise CheckpointError(
                f"checkpoint manifest version {raw.get('version')!r} is not {MANIFEST_VERSION}"
            )
        return cls(
            roots=tuple(raw["roots"]),
            entries=tuple(Entry.from_json(e) for e in raw["entries"]),
            blobs=dict(raw.get("blobs") or {}),
            skipped=int(raw.get("skipped", 0)),
        )


@dataclass(frozen=True)
class Change:
    """One path that differs between two manifests: ``added``, ``modified`` or ``removed``."""

    path: str
    change: str
    entry: Entry | None
    """The new entry (None for ``removed``)."""


def diff(before: Manifest | None, after: Manifest) -> list[Change]:
    """The paths ``after`` adds, modifies (kind, mode, content or target) or removes against ``before``."""
    old = before.by_path() if before is not None else {}
    new = after.by_path()
    out: list[Change] = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        if a is None and b is not None:
            out.append(Change(path, "added", b))
        elif b is None:
            out.append(Change(path, "removed", None))
        elif a != b:
            out.append(Change(path, "modified", b))
    return out


def change_rows(changes: list[Change]) -> list[CheckpointChange]:
    """The log's ``workspace_changes`` rows of ``changes``."""
    rows = []
    for c in changes:
        e = c.entry
        if e is None:
            rows.append(CheckpointChange(c.path, c.change))
        else:
            size = e.size if e.kind == "file" else None
            rows.append(CheckpointChange(c.path, c.change, e.kind, e.mode, size, e.sha256))
    return rows


@dataclass(frozen=True)
class Caps:
    """What one checkpoint may hold."""

    max_file_bytes: int = 64 * 1024 * 1024
    max_total_bytes: int = 1024 * 1024 * 1024
    max_entries: int = 200_000


@dataclass
class CaptureStats:
    """What one capture cost: entries walked, files read and hashed, bytes newly stored."""

    entries: int = 0
    hashed: int = 0
    hashed_bytes: int = 0


_StatKey = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


class Checkpointer:
    """Captures one sandbox's writable roots, remembering file hashes by stat (see the module docstring)."""

    def __init__(self, blobs: BlobStore, caps: Caps | None = None) -> None:
        self.blobs = blobs
        self.caps = caps or Caps()
        self._known: dict[str, tuple[_StatKey, str, str]] = {}  # host path -> (stat, sha256, uri)
        self.last_stats = CaptureStats()

    def capture(self, roots: Mapping[str, Path], overlays: Mapping[str, str] | None = None) -> Manifest:
        """The manifest of ``roots`` (name -> host folder) now, every file's bytes in the blob store.

        ``overlays``: the roots that are overlayfs upper folders, by name, with what each lies over
        (module docstring). Raises :class:`CheckpointTooLarge` past a cap and
        :class:`CheckpointError` when a root cannot be read. Runs in a worker thread (it reads files).
        """
        overlays = overlays or {}
        stats = self.last_stats = CaptureStats()
        entries: list[Entry] = []
        blobs: dict[str, str] = {}
        skipped = 0
        total = 0
        for name in sorted(roots):
            root = Path(roots[name])
            try:
                walked = self._walk(name, root, stats, name in overlays)
            except OSError as e:
                raise CheckpointError(f"cannot read the sandbox's {name} at {root}: {e.strerror}") from e
            for kind, rel, host, st in walked:
                if kind is None:
                    skipped += 1
                    continue
                if not rel and name in overlays:
                    entries.append(Entry(name, "overlay", stat.S_IMODE(st.st_mode), target=overlays[name]))
                    continue
                entry, uri = self._entry(kind, f"{name}/{rel}" if rel else name, host, st, stats)
                if entry.sha256 is not None and uri is not None:
                    blobs[entry.sha256] = uri
                    total += entry.size
                    if total > self.caps.max_total_bytes:
                        raise CheckpointTooLarge(
                            f"the sandbox's files hold more than {self.caps.max_total_bytes} bytes "
                            f"(checkpoints.max_total_mb)"
                        )
                entries.append(entry)
        return Manifest(tuple(sorted(roots)), tuple(entries), blobs, skipped)

    def _walk(
        self, name: str, root: Path, stats: CaptureStats, overlay: bool = False
    ) -> list[tuple[str | None, str, Path, os.stat_result]]:
        """Every entry under ``root`` (itself as ``""``), sorted, links not followed: (kind, rel, host, stat);
        with ``overlay``, whiteouts and opaque folders are told apart (:func:`overlay_kind`)."""
        out: list[tuple[str | None, str, Path, os.stat_result]] = [("dir", "", root, root.lstat())]
        stack = [root]
        while stack:
            folder = stack.pop()
            with os.scandir(folder) as it:
                children = sorted(it, key=lambda e: e.name)
            for child in children:
                stats.entries += 1
                if stats.entries > self.caps.max_entries:
                    raise CheckpointTooLarge(
                        f"the sandbox's {name} holds more than {self.caps.max_entries} entries"
                    )
                st = child.stat(follow_symlinks=False)
                host = Path(child.path)
                rel = host.relative_to(root).as_posix()
                kind = overlay_kind(host, st) if overlay else None
                if kind is not None:
                    out.append((kind, rel, host, st))
                    if kind == "opaque_dir":
                        stack.append(host)
                elif stat.S_ISDIR(st.st_mode):
                    out.append(("dir", rel, host, st))
                    stack.append(host)
                elif stat.S_ISREG(st.st_mode):
                    out.append(("file", rel, host, st))
                elif stat.S_ISLNK(st.st_mode):
                    out.append(("symlink", rel, host, st))
                else:
                    out.append((None, rel, host, st))
        out.sort(key=lambda x: x[1])
        return out

    def _entry(
        self, kind: str, path: str, host: Path, st: os.stat_result, stats: CaptureStats
    ) -> tuple[Entry, str | None]:
        """The manifest entry of one walked path, its file's bytes stored (once) when it changed."""
        mode = stat.S_IMODE(st.st_mode)
        if kind in ("dir", "opaque_dir"):
            return Entry(path, kind, mode), None
        if kind == "deleted":
            return Entry(path, "deleted"), None
        if kind == "symlink":
            return Entry(path, "symlink", mode, target=os.readlink(host)), None
        if st.st_size > self.caps.max_file_bytes:
            raise CheckpointTooLarge(
                f"{path} holds {st.st_size} bytes, over the checkpoint cap of {self.caps.max_file_bytes} "
                f"(checkpoints.max_file_mb)"
            )
        key: _StatKey = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        known = self._known.get(str(host))
        if known is not None and known[0] == key:
            return Entry(path, "file", mode, st.st_size, known[1]), known[2]
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        sha, uri = self.blobs.put(data)
        stats.hashed += 1
        stats.hashed_bytes += len(data)
        self._known[str(host)] = (key, sha, uri)
        return Entry(path, "file", mode, len(data), sha), uri


def overlay_kind(host: Path, st: os.stat_result) -> str | None:
    """``deleted`` for an overlayfs whiteout, ``opaque_dir`` for an opaque folder, None for anything
    else of an upper folder; refuses the redirect and metacopy xattrs (module docstring)."""
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return "deleted"
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return None
    names = [n for n in os.listxattr(host, follow_symlinks=False) if n.startswith(_OVERLAY_XATTRS)]
    for n in names:
        suffix = n.split(".overlay.", 1)[1]
        if suffix in ("redirect", "metacopy"):
            raise CheckpointError(
                f"{host} carries overlayfs {suffix}: such an upper folder is not built for checkpoints"
            )
        if suffix == "whiteout":
            return "deleted"
        if suffix == "opaque" and stat.S_ISDIR(st.st_mode):
            if os.getxattr(host, n, follow_symlinks=False) == b"y":
                return "opaque_dir"
    return None


def restore(manifest: Manifest, roots: Mapping[str, Path], blobs: BlobStore) -> None:
    """Make each root of ``roots`` hold exactly what ``manifest`` holds for it (a fresh sandbox's
    seeded files are replaced). Folders first, then files (created, never through a link), then
    links, then folder modes (a read-only folder would refuse its children). Refuses a manifest
    with other kinds of entries (an overlay's, a snapshot): its sandbox applies those."""
    other = sorted({e.kind for e in manifest.entries if e.kind not in HOST_KINDS})
    if other:
        raise CheckpointError(
            f"checkpoint entries of kind {', '.join(other)} are applied by their sandbox, not into host folders"
        )
    missing = [r for r in manifest.roots if r not in roots]
    if missing:
        raise CheckpointError(f"the sandbox has no {', '.join(missing)} to restore the checkpoint into")
    for name in manifest.roots:
        _clear(Path(roots[name]))
    dirs: list[tuple[Path, int]] = []
    for entry in manifest.entries:
        host = _host_path(entry.path, roots)
        if entry.kind == "dir":
            host.mkdir(exist_ok=True)
            dirs.append((host, entry.mode))
        elif entry.kind == "file":
            _write_file(host, entry, manifest, blobs)
    for entry in manifest.entries:
        if entry.kind == "symlink":
            os.symlink(str(entry.target), _host_path(entry.path, roots))
    for host, mode in reversed(dirs):
        os.chmod(host, mode)


def _host_path(path: str, roots: Mapping[str, Path]) -> Path:
    """The host path of manifest path ``path``; refuses ``..`` and unknown roots."""
    name, _, rel = path.partition("/")
    parts = [p for p in rel.split("/") if p]
    if name not in roots or any(p in (".", "..") for p in parts):
        raise CheckpointError(f"checkpoint path {path!r} is outside the sandbox's writable roots")
    return Path(roots[name]).joinpath(*parts)


def _write_file(host: Path, entry: Entry, manifest: Manifest, blobs: BlobStore) -> None:
    """Write one file of the checkpoint from its blob (checked against its sha256 by the store)."""
    uri = manifest.blobs.get(str(entry.sha256))
    if uri is None:
        raise CheckpointError(f"checkpoint manifest names no blob for {entry.path} ({entry.sha256})")
    data = blobs.get(uri)
    fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(host, entry.mode)


def _clear(root: Path) -> None:
    """Remove everything inside ``root`` (links removed, never followed), keeping ``root``."""
    for child in os.scandir(root):
        path = Path(child.path)
        if child.is_dir(follow_symlinks=False):
            for dirpath, _, _ in os.walk(path):  # a read-only folder would refuse its removal
                os.chmod(dirpath, 0o700)
            shutil.rmtree(path)
        else:
            path.unlink()
