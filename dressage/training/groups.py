"""Which groups are ready to train, in a deterministic order, rebuilt from the log by position.

Training tasks only (``tasks.kind = 'train'``): evaluation sessions are never trained.
A projection over the run's events (``session_started``, ``session_finalized``,
``task_released``/``task_failed``) plus the ``tasks`` table (task index, group index, sample index
of each task row). A (task, sample) pair is **terminal** at the position of

* its first ``finished`` session (an abandoned or failed attempt followed by a finished retry
  counts the finished one), or
* the event that marked its task row ``failed`` (no more attempts): then its last session's
  status (``failed``/``abandoned``) stands, or ``failed`` when it never had one.

A group (all ``n_samples_per_prompt`` pairs of one task) is **ready** at the position where its
last pair became terminal.

**Trees.** A session started with ``parent_session_id`` (a fork, docs/trees.md) is no attempt of a
pair: it joins its root's group as a :class:`Fork`, with the status it had when the group became
ready. In a tree run (the rollout config has a ``branching`` section) a pair is terminal when its
task is released ``done`` (the whole tree played), not at its root's finish. Ready groups are ordered by ``(ready_position, task_index)``: events
only ever add groups at the end of that order, so a consumer's cursor into it is stable and a
restarted trainer forms exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.errors import TrainingError
from dressage.store.event_store import EventStore
from dressage.store.records import Event, Run

TRACKED_KINDS = ("tasks_enqueued", "session_started", "session_finalized", "task_failed", "task_released")
"""The event kinds :meth:`GroupTracker.poll` reads: those that change a (task, sample) pair's state."""

Cursor = tuple[int, int]
"""``(ready_position, task_index)`` of the last consumed group; ``(0, -1)`` before the first."""

START_CURSOR: Cursor = (0, -1)


@dataclass(frozen=True)
class Member:
    """One (task, sample) pair of a ready group and the session that stands for it."""

    sample_index: int
    session_id: str | None
    status: str  # finished | failed | abandoned
    reward: float | None


@dataclass(frozen=True)
class Fork:
    """A session forked from a member's session (or from another fork), as of the group's readiness."""

    session_id: str
    parent_session_id: str
    fork_turn: int
    status: str  # running | finished | failed | abandoned
    reward: float | None


@dataclass(frozen=True)
class ReadyGroup:
    """A group whose members are all terminal."""

    task_index: int
    group_index: int
    ready_position: int
    members: tuple[Member, ...]
    forks: tuple[Fork, ...] = ()

    @property
    def cursor(self) -> Cursor:
        """This group's place in the consumption order."""
        return (self.ready_position, self.task_index)


@dataclass
class _Pair:
    task_index: int
    group_index: int
    sample_index: int
    sessions: list[str] = field(default_factory=list)
    finished: str | None = None
    terminal_at: int | None = None
    failed_task: bool = False


class GroupTracker:
    """Tails a run's events and yields groups as they become ready.

    ``n_samples_per_prompt`` (when given) must match the number of enqueued samples per task.
    """

    def __init__(self, store: EventStore, run: str | Run, n_samples_per_prompt: int | None = None) -> None:
        self.store = store
        self.run = store.runs.get(run)
        self.n_samples_per_prompt = n_samples_per_prompt
        rollout = self.run.config.get("rollout")
        self.tree_run = isinstance(rollout, dict) and bool(rollout.get("branching"))
        self._forks: dict[str, tuple[str, int]] = {}  # fork session -> (parent, fork turn)
        self._children: dict[str, list[str]] = {}
        self.position = 0
        self._pairs: dict[int, _Pair] = {}  # by task row id
        self._by_task: dict[int, list[_Pair]] = {}  # task_index -> its pairs
        self._task_size: dict[int, int] = {}  # task_index -> number of samples
        self._session_task: dict[str, int] = {}
        self._status: dict[str, tuple[str, float | None]] = {}
        self._emitted: set[int] = set()
        self._not_trained: set[int] = set()  # task row ids of eval tasks

    def _load_tasks(self) -> None:
        rows = self.store.tasks.pairs(self.run)
        for row in rows:
            if row.kind != "train":
                self._not_trained.add(row.id)  # eval tasks: never part of a group to train
            elif row.id not in self._pairs:
                pair = self._pairs[row.id] = _Pair(row.task_index, row.group_index, row.sample_index)
                self._by_task.setdefault(row.task_index, []).append(pair)
        sizes: dict[int, int] = {}
        for pair in self._pairs.values():
            sizes[pair.task_index] = sizes.get(pair.task_index, 0) + 1
        n = self.n_samples_per_prompt
        if n is not None and any(v != n for v in sizes.values()):
            bad = sorted(k for k, v in sizes.items() if v != n)[:5]
            raise TrainingError(
                f"run {self.run.name!r}: tasks {bad} have {sizes[bad[0]]} samples enqueued, but "
                f"--n-samples-per-prompt is {n}; pass the value the rollout used"
            )
        self._task_size = sizes

    def _pair_of(self, task_id: int) -> _Pair | None:
        if task_id in self._not_trained:
            return None
        if task_id not in self._pairs:
            self._load_tasks()
        return self._pairs.get(task_id)

    def poll(self, limit: int = 5000) -> list[ReadyGroup]:
        """Read events after the tracker's position; return groups that became ready, in order."""
        ready: list[ReadyGroup] = []
        while True:
            # Only the kinds that change a group's state are read (turn events, the bulk of a log,
            # stay in the database). Positions are dense and commit-ordered, so every event up to
            # the run's last position as read *before* the query is visible to the query: after a
            # short read the tracker has seen everything it needs up to there.
            bound = self.store.events.last_position(self.run)
            events = self.store.events.read(self.run, self.position, limit, kinds=TRACKED_KINDS)
            for ev in events:
                group = self._apply(ev)
                if group is not None:
                    ready.append(group)
            if events:
                self.position = events[-1].position
            if len(events) < limit:
                self.position = max(self.position, bound)
                return ready

    def _apply(self, ev: Event) -> ReadyGroup | None:
        p = ev.payload
        pair: _Pair | None = None
        if ev.kind == "tasks_enqueued":
            self._load_tasks()
        elif ev.kind == "session_started" and ev.session_id and p.get("parent_session_id") is not None:
            parent = str(p["parent_session_id"])
            self._forks[ev.session_id] = (parent, int(p["fork_turn"]))
            self._children.setdefault(parent, []).append(ev.session_id)
            return None
        elif ev.kind == "session_started" and ev.session_id and p.get("task_id") is not None:
            pair = self._pair_of(int(p["task_id"]))
            if pair is not None:
                self._session_task[ev.session_id] = int(p["task_id"])
                pair.sessions.append(ev.session_id)
            return None
        elif ev.kind == "session_finalized" and ev.session_id in self._forks:
            self._status[ev.session_id] = (str(p["status"]), p.get("reward"))
            return None
        elif ev.kind == "session_finalized" and ev.session_id in self._session_task:
            self._status[ev.session_id] = (str(p["status"]), p.get("reward"))
            pair = self._pairs[self._session_task[ev.session_id]]
            if p["status"] == "finished" and pair.finished is None and pair.terminal_at is None:
                pair.finished = ev.session_id
                if not self.tree_run:
                    pair.terminal_at = ev.position
        elif self.tree_run and ev.kind == "task_released" and p.get("state") == "done":
            pair = self._pair_of(int(p["task_id"]))
            if pair is not None and pair.terminal_at is None and pair.finished is not None:
                pair.terminal_at = ev.position
        elif (ev.kind == "task_failed" or (ev.kind == "task_released" and p.get("state") == "failed")) and (
            p.get("task_id") is not None
        ):
            pair = self._pair_of(int(p["task_id"]))
            if pair is not None and pair.terminal_at is None:
                pair.failed_task = True
                pair.terminal_at = ev.position
        if pair is None or pair.terminal_at != ev.position:
            return None
        return self._ready_group(pair.task_index, ev.position)

    def _ready_group(self, task_index: int, position: int) -> ReadyGroup | None:
        if task_index in self._emitted:
            return None
        pairs = sorted(self._by_task.get(task_index, []), key=lambda x: x.sample_index)
        if any(x.terminal_at is None for x in pairs):
            return None
        members = []
        for x in pairs:
            if x.finished is not None:
                status, reward = self._status[x.finished]
                members.append(Member(x.sample_index, x.finished, status, reward))
            elif x.sessions:
                last = x.sessions[-1]
                status, reward = self._status.get(last, ("failed", None))
                members.append(
                    Member(x.sample_index, last, status if status != "running" else "failed", None)
                )
            else:
                members.append(Member(x.sample_index, None, "failed", None))
        self._emitted.add(task_index)
        forks = self._forks_under([m.session_id for m in members if m.session_id is not None])
        return ReadyGroup(task_index, pairs[0].group_index, position, tuple(members), forks)

    def _forks_under(self, roots: list[str]) -> tuple[Fork, ...]:
        """Every session forked (directly or not) from ``roots``, in start order per parent."""
        out: list[Fork] = []
        todo = list(roots)
        while todo:
            for child in self._children.get(todo.pop(0), []):
                parent, fork_turn = self._forks[child]
                status, reward = self._status.get(child, ("running", None))
                out.append(Fork(child, parent, fork_turn, status, reward))
                todo.append(child)
        return tuple(out)
