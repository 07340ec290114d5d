"""Runs in the log: create (or continue) a run with its frozen config, look runs up, drop them."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from sqlalchemy import Row, and_, case, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from dressage.errors import InvalidRecordError, UnknownRunError
from dressage.store import schema as t
from dressage.store.config_diff import describe_difference
from dressage.store.database import Database
from dressage.store.records import Run, RunSummary, canonical_json, check_text


class RunRepository:
    """Runs of the log, cached by name (a run never changes once created)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: dict[str, Run] = {}

    def create(
        self, name: str, config: Mapping[str, object] | None = None, *, must_match: bool = True
    ) -> Run:
        """Create run ``name`` with a frozen config snapshot, or continue it if it exists.

        When the run exists and ``must_match`` is set, its stored config must equal ``config``
        (a frozen snapshot cannot change under a resumed run).
        """
        check_text(name, what="run name", max_chars=200)
        if not name.strip():
            raise InvalidRecordError("run name must not be empty")
        config = dict(config or {})
        data = canonical_json(config, what=f"config of run {name!r}", max_bytes=self.db.max_payload_bytes)
        config_hash = hashlib.sha256(data).hexdigest()
        existing = self._load(name)
        if existing is None:
            try:
                with self.db.write() as conn:
                    run_id = conn.execute(
                        insert(t.runs)
                        .values(name=name, config=config, config_hash=config_hash, created_at=time.time())
                        .returning(t.runs.c.id)
                    ).scalar_one()
                    conn.execute(insert(t.run_counters).values(run_id=run_id, last_position=0))
                    self.db.append_event_tx(
                        conn,
                        run_id,
                        "run_created",
                        {"name": name, "config_hash": config_hash},
                        key="run_created",
                    )
            except IntegrityError:
                pass  # another process created it first; fall through to the comparison
            existing = self._load(name)
            assert existing is not None
        if must_match and existing.config_hash != config_hash and config:
            raise InvalidRecordError(
                f"run {name!r} exists with a different config: {describe_difference(existing.config, config)} "
                f"differ (hash {existing.config_hash[:12]}, given {config_hash[:12]}); resume it without a "
                "config or choose a new run name"
            )
        return existing

    def get(self, run: str | Run) -> Run:
        """The run called ``run``; raises :class:`UnknownRunError` when the log has none."""
        if isinstance(run, Run):
            return run
        found = self._cache.get(run) or self._load(run)
        if found is None:
            raise UnknownRunError(f"no run named {run!r} in the log; list runs with `dressage-worker runs`")
        return found

    def by_id(self, run_id: int) -> Run:
        """The run with database id ``run_id``."""
        for run in self._cache.values():
            if run.id == run_id:
                return run
        with self.db.read() as conn:
            name = conn.execute(select(t.runs.c.name).where(t.runs.c.id == run_id)).scalar_one_or_none()
        if name is None:
            raise UnknownRunError(f"no run with id {run_id}")
        return self.get(str(name))

    def list(self) -> list[Run]:
        """Every run, oldest first."""
        with self.db.read() as conn:
            rows = conn.execute(select(t.runs).order_by(t.runs.c.id)).all()
        return [_run(r) for r in rows]

    def _load(self, name: str) -> Run | None:
        with self.db.read() as conn:
            r = conn.execute(select(t.runs).where(t.runs.c.name == name)).first()
        if r is None:
            return None
        run = _run(r)
        self._cache[name] = run
        return run

    def drop(self, run: str | Run) -> None:
        """Delete every row of a run (artifact blobs stay: they are content-addressed and may be shared)."""
        r = self.get(run)
        with self.db.write() as conn:
            for table in (
                t.turns,
                t.artifacts,
                t.events,
                t.sessions,
                t.tasks,
                t.policy_versions,
                t.consumer_checkpoints,
                t.train_step_metrics,
                t.train_token_decisions,
                t.train_steps,
                t.run_counters,
            ):
                conn.execute(delete(table).where(table.c.run_id == r.id))
            conn.execute(delete(t.runs).where(t.runs.c.id == r.id))
        self._cache.pop(r.name, None)

    def last_position(self, run: str | Run) -> int:
        """The position of the run's newest event (0 when empty)."""
        return self.db.last_position(self.get(run).id)

    def summary(self, run: str | Run) -> RunSummary:
        """Counts for the ``runs`` table: sessions by status (all, and eval alone), turns, tokens and
        the mean reward of finished sessions, training and eval apart (eval sessions are never
        trained: a made-up mix of the two would match neither curve)."""
        r = self.get(run)
        s, k = t.sessions.c, t.tasks.c
        is_eval = func.coalesce(k.kind, "train") == "eval"
        with self.db.read() as conn:
            by_status: dict[str, int] = {}
            eval_status: dict[str, int] = {}
            for status, evaluating, n in conn.execute(
                select(s.status, is_eval, func.count())
                .select_from(t.sessions.outerjoin(t.tasks, k.id == s.task_id))
                .where(s.run_id == r.id)
                .group_by(s.status, is_eval)
            ).all():
                by_status[str(status)] = by_status.get(str(status), 0) + int(n)
                if evaluating:
                    eval_status[str(status)] = int(n)
            u = t.turns.c
            turns_row = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(u.n_context + u.n_generated), 0),
                    # eval sessions are never trained, whatever loss mask their turns recorded
                    func.coalesce(func.sum(case((is_eval, 0), else_=u.n_trained)), 0),
                )
                .select_from(
                    t.turns.join(t.sessions, s.id == u.session_id).outerjoin(t.tasks, k.id == s.task_id)
                )
                .where(u.run_id == r.id)
            ).one()
            means: dict[bool, float | None] = {
                bool(e): m
                for e, m in conn.execute(
                    select(is_eval, func.avg(s.reward))
                    .select_from(t.sessions.outerjoin(t.tasks, k.id == s.task_id))
                    .where(and_(s.run_id == r.id, s.status == "finished"))
                    .group_by(is_eval)
                ).all()
            }
        train_mean = next((m for e, m in means.items() if not e), None)
        eval_mean = next((m for e, m in means.items() if e), None)
        return RunSummary(
            run=r.name,
            sessions=by_status,
            turns=int(turns_row[0]),
            tokens=int(turns_row[1]),
            trained_tokens=int(turns_row[2]),
            mean_reward=float(train_mean) if train_mean is not None else None,
            last_position=self.db.last_position(r.id),
            eval_sessions=eval_status,
            eval_mean_reward=float(eval_mean) if eval_mean is not None else None,
        )


def _run(r: Row[object]) -> Run:
    return Run(r.id, r.name, r.config, r.config_hash, r.created_at)
