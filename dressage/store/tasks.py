"""Task queue with leases: enqueue (task, sample) pairs, claim them, renew, release.

Many rollout workers on many machines share one database. A claim takes pending tasks, or tasks
whose lease expired (their owner crashed), under a lease; on PostgreSQL with
``FOR UPDATE SKIP LOCKED`` so workers never wait on each other's rows, on SQLite under the
database write lock. Reclaiming an expired task marks its previous, still-running session
``abandoned`` (kept for audit, never trained on) in the same transaction, unless the claim
resumes (``resume=True``): then the session stays ``running`` for the new attempt to continue
(see :mod:`dressage.store.sessions`), and is abandoned only when the task has no attempt left.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, and_, func, insert, or_, select, update

from dressage.errors import InvalidRecordError, LeaseError
from dressage.store import schema as t
from dressage.store.database import Database
from dressage.store.records import (
    Run,
    TaskLease,
    TaskPair,
    TaskSpec,
    TaskState,
    canonical_json,
    check_text,
    deterministic_key,
)
from dressage.store.runs import RunRepository

TASK_STATES = ("pending", "leased", "done", "failed")


@dataclass(frozen=True)
class Requeued:
    """What :meth:`TaskRepository.requeue_failed` did: pairs requeued, and agent failures left failed."""

    infrastructure: int
    """Failed pairs whose last attempt failed on infrastructure (always requeued)."""
    agent: int
    """Failed pairs whose last session failed, requeued (``agent_failures``)."""
    agent_left: int
    """Failed pairs whose last session failed, left failed (without ``agent_failures``)."""


class TaskRepository:
    """The run's task queue: (task, sample) pairs under leases."""

    def __init__(self, db: Database, runs: RunRepository) -> None:
        self.db = db
        self.runs = runs

    def enqueue(
        self,
        run: str | Run,
        specs: Sequence[TaskSpec],
        n_samples: int = 1,
        *,
        eval_version: int | None = None,
    ) -> int:
        """Add ``n_samples`` (task, sample) pairs per spec; pairs already present are left alone.

        With ``eval_version`` the pairs are evaluation tasks (``kind`` ``eval``) of that policy
        version: same leases, sessions and rewards, never trained; their task indexes are their
        own (unique among eval tasks of the run). Returns the number of pairs added. Idempotent,
        so a resumed run (or every worker of a run) can enqueue again.
        """
        if n_samples < 1:
            raise InvalidRecordError(f"n_samples must be >= 1, got {n_samples}")
        if eval_version is not None and eval_version < 0:
            raise InvalidRecordError(f"eval_version must be >= 0, got {eval_version}")
        kind = "train" if eval_version is None else "eval"
        r = self.runs.get(run)
        for spec in specs:
            if spec.task_index < 0:
                raise InvalidRecordError(f"task_index must be >= 0, got {spec.task_index}")
            canonical_json(
                spec.payload, what=f"payload of task {spec.task_index}", max_bytes=self.db.max_payload_bytes
            )

        def tx(conn: Connection) -> int:
            have = set(
                conn.execute(
                    select(t.tasks.c.task_index, t.tasks.c.sample_index).where(
                        t.tasks.c.run_id == r.id, t.tasks.c.kind == kind
                    )
                ).all()
            )
            now = time.time()
            rows = [
                {
                    "run_id": r.id,
                    "task_index": spec.task_index,
                    "group_index": spec.task_index,
                    "sample_index": k,
                    "payload": spec.payload,
                    "state": "pending",
                    "attempts": 0,
                    "updated_at": now,
                    "kind": kind,
                    "eval_version": eval_version,
                }
                for spec in specs
                for k in range(n_samples)
                if (spec.task_index, k) not in have
            ]
            if rows:
                conn.execute(insert(t.tasks), rows)
                payload: dict[str, object] = {"n_added": len(rows), "n_samples": n_samples}
                if eval_version is not None:
                    payload.update(kind="eval", eval_version=eval_version)
                self.db.append_event_tx(conn, r.id, "tasks_enqueued", payload)
            return len(rows)

        return int(self.db.retrying(tx))

    def claim(
        self,
        run: str | Run,
        owner: str,
        *,
        n: int = 1,
        lease_s: float = 60.0,
        max_attempts: int | None = None,
        resume: bool = False,
    ) -> list[TaskLease]:
        """Claim up to ``n`` pending or lease-expired tasks for ``owner`` for ``lease_s`` seconds.

        Expired tasks that already used ``max_attempts`` attempts are marked ``failed`` instead of
        claimed (a pending task is claimed whatever its count: its failed attempts were counted when
        it was released, see :meth:`release` and :meth:`requeue_failed`).
        An expired task's running session is abandoned, or with ``resume`` left running for the
        new attempt to take over (:meth:`~dressage.store.sessions.SessionRepository.take_over`).
        Eval tasks come first (``'eval' < 'train'``): they should be sampled by the policy version
        they evaluate, before the next weight push.
        """
        check_text(owner, what="lease owner", max_chars=200)
        r = self.runs.get(run)

        def tx(conn: Connection) -> list[TaskLease]:
            now = time.time()
            claimable = or_(
                t.tasks.c.state == "pending",
                and_(t.tasks.c.state == "leased", t.tasks.c.lease_expires_at < now),
            )
            q = (
                select(t.tasks)
                .where(t.tasks.c.run_id == r.id, claimable)
                .order_by(t.tasks.c.kind, t.tasks.c.task_index, t.tasks.c.sample_index)
                .limit(n)
            )
            if self.db.dialect == "postgresql":
                q = q.with_for_update(skip_locked=True)
            leases: list[TaskLease] = []
            rows = conn.execute(q).all()
            self._lock_running_sessions_tx(conn, [row.id for row in rows if row.state == "leased"])
            for row in rows:
                # Only an expired lease uses up an attempt here: a pending task's attempts were counted
                # when it was released (requeued tasks and engine interruptions get another attempt).
                exhausted = (
                    row.state == "leased" and max_attempts is not None and row.attempts >= max_attempts
                )
                if row.state == "leased" and (exhausted or not resume):
                    self._abandon_sessions_tx(conn, r, row.id, reason="lease_expired")
                if exhausted:
                    conn.execute(
                        update(t.tasks).where(t.tasks.c.id == row.id).values(state="failed", updated_at=now)
                    )
                    self.db.append_event_tx(
                        conn, r.id, "task_failed", {"task_id": row.id, "attempts": row.attempts}
                    )
                    continue
                leases.append(self._lease_tx(conn, r, row, owner, now + lease_s, now))
            return leases

        return list(self.db.retrying(tx))

    def _lease_tx(
        self, conn: Connection, r: Run, row: Row[object], owner: str, expires: float, now: float
    ) -> TaskLease:
        """Lease the task of ``row`` to ``owner`` until ``expires`` and record ``task_claimed``."""
        attempt = row.attempts + 1
        conn.execute(
            update(t.tasks)
            .where(t.tasks.c.id == row.id)
            .values(
                state="leased", lease_owner=owner, lease_expires_at=expires, attempts=attempt, updated_at=now
            )
        )
        self.db.append_event_tx(
            conn,
            r.id,
            "task_claimed",
            {"task_id": row.id, "attempt": attempt, "owner": owner},
            key=deterministic_key(r.name, "claim", row.id, attempt),
        )
        return TaskLease(
            row.id,
            r.id,
            row.task_index,
            row.group_index,
            row.sample_index,
            attempt,
            row.payload,
            owner,
            expires,
            row.kind,
            row.eval_version,
        )

    def _lock_running_sessions_tx(self, conn: Connection, task_ids: list[int]) -> None:
        """Lock the running sessions of expired leases before any event takes the run's counter row
        (the turn append locks a session, then the counter: the same order never deadlocks)."""
        if task_ids:
            conn.execute(
                select(t.sessions.c.id)
                .where(t.sessions.c.task_id.in_(task_ids), t.sessions.c.status == "running")
                .with_for_update()
            ).all()

    def _abandon_sessions_tx(self, conn: Connection, run: Run, task_id: int, *, reason: str) -> None:
        running = (
            conn.execute(
                select(t.sessions.c.id).where(
                    t.sessions.c.task_id == task_id, t.sessions.c.status == "running"
                )
            )
            .scalars()
            .all()
        )
        for sid in running:
            self.db.append_event_tx(
                conn,
                run.id,
                "session_finalized",
                {"status": "abandoned", "reward": None, "finish_reason": reason, "error": None, "info": {}},
                key=deterministic_key(run.name, sid, "final"),
                session_id=sid,
            )
            conn.execute(
                update(t.sessions)
                .where(t.sessions.c.id == sid)
                .values(status="abandoned", finish_reason=reason, finished_at=time.time())
            )

    def renew(self, lease: TaskLease, lease_s: float = 60.0) -> TaskLease:
        """Extend a lease; raises :class:`LeaseError` if it is no longer held by its owner."""
        expires = time.time() + lease_s
        with self.db.write() as conn:
            n = conn.execute(
                update(t.tasks).where(_held(lease)).values(lease_expires_at=expires, updated_at=time.time())
            ).rowcount
        if n != 1:
            raise LeaseError(
                f"task {lease.task_id} attempt {lease.attempt} is no longer leased by {lease.owner}"
            )
        return TaskLease(**{**lease.__dict__, "expires_at": expires})

    def release(self, lease: TaskLease, outcome: str, *, max_attempts: int | None = None) -> str:
        """End a lease: ``done`` (a finished session exists), ``retry`` (back to pending) or ``failed``.

        ``retry`` turns into ``failed`` when the task used ``max_attempts``. Returns the new state.
        """
        if outcome not in ("done", "retry", "failed"):
            raise InvalidRecordError(f"outcome must be done, retry or failed, got {outcome!r}")
        state = {"done": "done", "retry": "pending", "failed": "failed"}[outcome]
        if state == "pending" and max_attempts is not None and lease.attempt >= max_attempts:
            state = "failed"
        r = self.runs.by_id(lease.run_id)

        def tx(conn: Connection) -> str:
            n = conn.execute(
                update(t.tasks)
                .where(_held(lease))
                .values(state=state, lease_owner=None, lease_expires_at=None, updated_at=time.time())
            ).rowcount
            if n != 1:
                raise LeaseError(
                    f"task {lease.task_id} attempt {lease.attempt} is no longer leased by {lease.owner} "
                    "(its lease expired and another worker took it)"
                )
            self.db.append_event_tx(
                conn,
                r.id,
                "task_released",
                {"task_id": lease.task_id, "attempt": lease.attempt, "state": state},
                key=deterministic_key(r.name, "release", lease.task_id, lease.attempt),
            )
            return state

        return str(self.db.retrying(tx))

    def hand_back(self, lease: TaskLease) -> bool:
        """Expire a held lease now, without an outcome (a worker stopping gracefully): the pair is
        claimable at once, exactly as if its owner had died, so the next claim takes its running
        session over (``resume``) or abandons it. Records ``task_handed_back``; False when the lease
        was no longer held (nothing to hand back)."""
        r = self.runs.by_id(lease.run_id)

        def tx(conn: Connection) -> bool:
            now = time.time()
            n = conn.execute(
                update(t.tasks).where(_held(lease)).values(lease_expires_at=now, updated_at=now)
            ).rowcount
            if n == 1:
                self.db.append_event_tx(
                    conn,
                    r.id,
                    "task_handed_back",
                    {"task_id": lease.task_id, "attempt": lease.attempt, "owner": lease.owner},
                    key=deterministic_key(r.name, "hand_back", lease.task_id, lease.attempt),
                )
            return n == 1

        return bool(self.db.retrying(tx))

    def requeue_failed(self, run: str | Run, *, agent_failures: bool = False) -> Requeued:
        """Put ``failed`` pairs back to ``pending`` (``rollout --resume``): each gets one more attempt.

        A pair whose last session ``failed`` failed on the agent's side (its agent, sandbox or reward):
        requeued only with ``agent_failures`` (``--retry-failed``). Any other failed pair failed on
        infrastructure (its last attempt's lease expired: a worker or engine died) and is always
        requeued. Records ``tasks_requeued`` with the task ids.
        """
        r = self.runs.get(run)
        c, s = t.tasks.c, t.sessions.c

        def tx(conn: Connection) -> Requeued:
            failed = conn.execute(select(c.id).where(c.run_id == r.id, c.state == "failed")).scalars().all()
            last: dict[int, str] = {}
            if failed:
                rows = conn.execute(
                    select(s.task_id, s.status)
                    .where(s.run_id == r.id, s.task_id.in_(failed))
                    .order_by(s.task_id, s.attempt, s.created_at)
                ).all()
                last = {int(row.task_id): str(row.status) for row in rows}
            agent = [i for i in failed if last.get(i) == "failed"]
            infra = [i for i in failed if last.get(i) != "failed"]
            again = sorted(infra + (agent if agent_failures else []))
            if again:
                conn.execute(
                    update(t.tasks).where(c.id.in_(again)).values(state="pending", updated_at=time.time())
                )
                self.db.append_event_tx(
                    conn, r.id, "tasks_requeued", {"task_ids": again, "agent_failures": agent_failures}
                )
            return Requeued(
                len(infra), len(agent) if agent_failures else 0, 0 if agent_failures else len(agent)
            )

        return self.db.retrying(tx)

    def counts(self, run: str | Run, *, kind: str | None = None) -> dict[str, int]:
        """Number of (task, sample) pairs per state (of one ``kind``, ``train`` or ``eval``, if given)."""
        r = self.runs.get(run)
        where = [t.tasks.c.run_id == r.id] + ([t.tasks.c.kind == kind] if kind is not None else [])
        with self.db.read() as conn:
            rows = conn.execute(
                select(t.tasks.c.state, func.count()).where(*where).group_by(t.tasks.c.state)
            ).all()
        counts: dict[str, Any] = {s: 0 for s in TASK_STATES}
        counts.update({k: int(v) for k, v in rows})
        return counts

    def states(self, run: str | Run, *, kind: str) -> list[TaskState]:
        """Every (task, sample) pair of ``kind`` with its state, in (eval version, task, sample) order."""
        r = self.runs.get(run)
        c = t.tasks.c
        with self.db.read() as conn:
            rows = conn.execute(
                select(c.id, c.task_index, c.sample_index, c.state, c.kind, c.eval_version)
                .where(c.run_id == r.id, c.kind == kind)
                .order_by(c.eval_version, c.task_index, c.sample_index)
            ).all()
        return [TaskState(*row) for row in rows]

    def kind_of(self, task_id: int) -> tuple[str, int | None]:
        """The kind (``train`` or ``eval``) of task ``task_id`` and the policy version it evaluates."""
        c = t.tasks.c
        with self.db.read() as conn:
            row = conn.execute(select(c.kind, c.eval_version).where(c.id == task_id)).first()
        if row is None:
            raise InvalidRecordError(f"no task with id {task_id}")
        return str(row.kind), row.eval_version

    def payload_of(self, task_id: int) -> dict[str, Any]:
        """The payload (the dataset row as queued) of task ``task_id``."""
        c = t.tasks.c
        with self.db.read() as conn:
            row = conn.execute(select(c.payload).where(c.id == task_id)).first()
        if row is None:
            raise InvalidRecordError(f"no task with id {task_id}")
        return dict(row.payload or {})

    def leases_of_others(self, run: str | Run, owner: str) -> list[tuple[str, int, float]]:
        """``(owner, leased pairs, latest lease expiry)`` for every owner but ``owner`` holding leases
        in the run, by owner name: what a worker with nothing left to claim waits for."""
        r = self.runs.get(run)
        c = t.tasks.c
        with self.db.read() as conn:
            rows = conn.execute(
                select(c.lease_owner, func.count(), func.max(c.lease_expires_at))
                .where(c.run_id == r.id, c.state == "leased", c.lease_owner != owner)
                .group_by(c.lease_owner)
                .order_by(c.lease_owner)
            ).all()
        return [(str(o), int(n), float(e or 0.0)) for o, n, e in rows]

    def pairs(self, run: str | Run) -> list[TaskPair]:
        """Every (task, sample) pair of the run with its group, of every kind, in no particular order."""
        r = self.runs.get(run)
        c = t.tasks.c
        with self.db.read() as conn:
            rows = conn.execute(
                select(c.id, c.task_index, c.group_index, c.sample_index, c.kind).where(c.run_id == r.id)
            ).all()
        return [TaskPair(*row) for row in rows]


def _held(lease: TaskLease) -> Any:
    return and_(
        t.tasks.c.id == lease.task_id,
        t.tasks.c.state == "leased",
        t.tasks.c.lease_owner == lease.owner,
        t.tasks.c.attempts == lease.attempt,
    )
