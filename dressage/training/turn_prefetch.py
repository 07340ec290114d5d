"""Reading finished sessions' turns ahead of materialization, a few groups per query.

On PostgreSQL most of a step's read is the server encoding per-token arrays; the client's share
is decoding them and building samples. Read in one query per step, the two wait on each other.
:class:`TurnPrefetcher` splits a step's sessions into chunks of a few groups and reads them on two
connections in background threads, so the server encodes the next chunks while the trainer
materializes the first, and the next step's groups are asked for before this step is hashed.

Only finished sessions are read ahead: their turns can no longer change, so a turn list read early
is the one a read at use time would return. SQLite reads in the caller's thread (one file, and
parsing its JSON arrays needs the interpreter anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from dressage.store.event_store import EventStore
from dressage.store.records import Turn
from dressage.training.groups import ReadyGroup

CHUNK_GROUPS = 2
"""Groups per background query: small enough to start materializing early, big enough that a
query's round trip stays a small share of its cost."""
READERS = 2
"""Background reader threads (each with its own connection): one per core of a small machine."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    """The process's reader threads, started on first use and shared by every prefetcher."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READERS, thread_name_prefix="dressage-turn-reader")
        return _pool


def finished_sessions(groups: Sequence[ReadyGroup]) -> list[str]:
    """The finished members' session ids of ``groups``, in group then sample order, then their
    finished forks (a tree's sessions, docs/trees.md)."""
    members = [m.session_id for g in groups for m in g.members if m.session_id and m.status == "finished"]
    return members + [f.session_id for g in groups for f in g.forks if f.status == "finished"]


class TurnPrefetcher:
    """Turns of finished sessions, read ahead in chunks and handed out by session."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._pending: dict[str, Future[dict[str, list[Turn]]]] = {}

    @property
    def read_ahead(self) -> set[str]:
        """Sessions asked for and not yet handed out."""
        return set(self._pending)

    def want(self, groups: Sequence[ReadyGroup]) -> None:
        """Start reading the finished sessions of ``groups`` not already asked for (PostgreSQL only)."""
        if self.store.db.dialect != "postgresql":
            return
        for start in range(0, len(groups), CHUNK_GROUPS):
            ids = [
                s for s in finished_sessions(groups[start : start + CHUNK_GROUPS]) if s not in self._pending
            ]
            if ids:
                future = _readers().submit(self._read, ids)
                self._pending.update(dict.fromkeys(ids, future))

    def turns(self, session_ids: Sequence[str]) -> dict[str, list[Turn]]:
        """Every turn of ``session_ids`` by session (read now unless asked for before)."""
        out: dict[str, list[Turn]] = {}
        missing = [s for s in session_ids if s not in self._pending]
        if missing:
            out.update(self._read(missing))
        for sid in session_ids:
            future = self._pending.pop(sid, None)
            if future is not None:
                out[sid] = future.result().get(sid, [])
        return out

    def _read(self, session_ids: list[str]) -> dict[str, list[Turn]]:
        by_session: dict[str, list[Turn]] = {sid: [] for sid in session_ids}
        for turn in self.store.turns.read(session_ids=session_ids):
            by_session[turn.session_id].append(turn)
        return by_session
