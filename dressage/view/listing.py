"""The sessions of a run as a filtered, sorted, server-side paginated table.

Filters and sort are typed (:class:`SessionQuery`, built from the page's query string with
one-line errors naming the field); the SQL pages on the server, so a run with 10,000 sessions
sends 50 rows. Turn aggregates (turns, tokens, trained tokens) are computed only for the page's
sessions; sorting by one orders by a per-session lookup in the turns' index. Text search decodes the candidates' tokens and
looks for the text in the conversation, error and task; it scans at most :data:`MAX_TEXT_SCAN`
sessions (the page says so when it stopped early).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from sqlalchemy import ColumnElement, Select, and_, asc, case, desc, func, select

from dressage.errors import RequestError
from dressage.store import EventStore, schema
from dressage.store.records import SESSION_STATUSES
from dressage.view.decode import TokenDecoder
from dressage.view.readonly import reading

MAX_TEXT_SCAN = 2000
MAX_PER_PAGE = 500
_S, _K, _T = schema.sessions, schema.tasks, schema.turns

SORTABLE = {
    "created": _S.c.created_at,
    "session": _S.c.id,
    "status": _S.c.status,
    "reward": _S.c.reward,
    "finish": _S.c.finish_reason,
    "agent": _S.c.agent,
    "attempt": _S.c.attempt,
    "task": _K.c.task_index,
    "group": _K.c.group_index,
    "sample": _K.c.sample_index,
    "kind": _K.c.kind,
}
AGGREGATE_SORTS = ("turns", "tokens", "trained")
SESSION_KINDS = ("train", "eval")
"""A session's kind: of a training task (or of no task), or of an eval task (never trained)."""
COLUMNS = (*SORTABLE, *AGGREGATE_SORTS)


@dataclass(frozen=True)
class SessionQuery:
    """What the sessions table shows: filters, sort and page."""

    status: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    task: int | None = None
    group: int | None = None
    agent: str | None = None
    finish: str | None = None
    kind: str | None = None
    text: str | None = None
    sort: str = "created"
    descending: bool = False
    page: int = 1
    per_page: int = 50

    @classmethod
    def from_params(cls, params: dict[str, str]) -> SessionQuery:
        """Parse a query string; a bad value raises :class:`RequestError` naming the field."""
        allowed = {f for f in cls.__dataclass_fields__} | {"order"}
        for name in params:
            if name not in allowed:
                raise RequestError(f"unknown filter {name!r}; use one of {sorted(allowed)}", param=name)
        values: dict[str, Any] = {}
        for name in ("status", "agent", "finish", "kind", "text"):
            if params.get(name):
                values[name] = params[name]
        if values.get("status") and values["status"] not in SESSION_STATUSES:
            raise RequestError(f"status must be one of {SESSION_STATUSES}", param="status")
        if values.get("kind") and values["kind"] not in SESSION_KINDS:
            raise RequestError(f"kind must be one of {SESSION_KINDS}", param="kind")
        for name in ("reward_min", "reward_max"):
            if params.get(name):
                values[name] = _number(params[name], name, float)
        for name in ("task", "group", "page", "per_page"):
            if params.get(name):
                values[name] = _number(params[name], name, int)
        sort = params.get("sort") or "created"
        if sort not in COLUMNS:
            raise RequestError(f"sort must be one of {list(COLUMNS)}", param="sort")
        values["sort"] = sort
        order = params.get("order") or "asc"
        if order not in ("asc", "desc"):
            raise RequestError("order must be asc or desc", param="order")
        values["descending"] = order == "desc"
        q = cls(**values)
        if q.page < 1:
            raise RequestError("page must be >= 1", param="page")
        if not 1 <= q.per_page <= MAX_PER_PAGE:
            raise RequestError(f"per_page must be between 1 and {MAX_PER_PAGE}", param="per_page")
        return q

    def params(self, **changes: object) -> dict[str, str]:
        """The query string of this query with ``changes`` (for links: sort, next page)."""
        values = {**self.__dict__, **changes}
        out = {}
        for name, value in values.items():
            if name == "descending":
                out["order"] = "desc" if value else "asc"
            elif value is not None and value != getattr(SessionQuery, name, None):
                out[name] = str(value)
        if out.get("order") == "asc":
            out.pop("order")
        return out


_Num = TypeVar("_Num", int, float)


def _number(text: str, name: str, kind: type[_Num]) -> _Num:
    try:
        return kind(text)
    except ValueError:
        raise RequestError(f"{name} must be a number, got {text!r}", param=name) from None


@dataclass
class SessionPage:
    """One page of the table, its total and (for text search) how far the scan went."""

    rows: list[dict[str, Any]]
    total: int
    query: SessionQuery
    scanned: int | None = None
    candidates: int | None = None
    agents: list[str] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        """Number of pages (at least 1)."""
        return max(1, -(-self.total // self.query.per_page))


def _filtered(run_id: int, q: SessionQuery) -> Select[Any]:
    stmt = (
        select(
            _S.c.id.label("session"),
            _S.c.status,
            _S.c.reward,
            _S.c.finish_reason.label("finish"),
            _S.c.agent,
            _S.c.attempt,
            _S.c.error,
            _S.c.created_at.label("created"),
            _S.c.finished_at,
            _K.c.task_index.label("task"),
            _K.c.group_index.label("group"),
            _K.c.sample_index.label("sample"),
            func.coalesce(_K.c.kind, "train").label("kind"),
            _K.c.eval_version,
        )
        .select_from(_S.outerjoin(_K, _K.c.id == _S.c.task_id))
        .where(_S.c.run_id == run_id)
    )
    conditions = []
    if q.status:
        conditions.append(_S.c.status == q.status)
    if q.reward_min is not None:
        conditions.append(_S.c.reward >= q.reward_min)
    if q.reward_max is not None:
        conditions.append(_S.c.reward <= q.reward_max)
    if q.task is not None:
        conditions.append(_K.c.task_index == q.task)
    if q.group is not None:
        conditions.append(_K.c.group_index == q.group)
    if q.agent:
        conditions.append(_S.c.agent == q.agent)
    if q.finish:
        conditions.append(_S.c.finish_reason == q.finish)
    if q.kind:
        conditions.append(func.coalesce(_K.c.kind, "train") == q.kind)
    return stmt.where(and_(*conditions)) if conditions else stmt


def _aggregates(run_id: int, session_ids: list[str] | None) -> Select[Any]:
    stmt = select(
        _T.c.session_id,
        func.count().label("turns"),
        func.sum(_T.c.n_context + _T.c.n_generated).label("tokens"),
        func.sum(_T.c.n_trained).label("trained"),
    ).where(_T.c.run_id == run_id)
    if session_ids is not None:
        stmt = stmt.where(_T.c.session_id.in_(session_ids))
    return stmt.group_by(_T.c.session_id)


def _aggregate_of_session(name: str) -> ColumnElement[Any]:
    """The turn aggregate ``name`` of each session row, as a correlated subquery (one lookup in the
    turns' ``(session_id, turn_index)`` index per session). Not a join with the aggregated turns:
    while a run grows faster than the database's statistics, PostgreSQL's planner may expect one
    session and nest the join, which went quadratic (2 s for 10,000 sessions, bench/view_run.py)."""
    value = {
        "turns": func.count(),
        "tokens": func.sum(_T.c.n_context + _T.c.n_generated),
        "trained": func.sum(_T.c.n_trained),
    }[name]
    found = select(func.coalesce(value, 0)).where(_T.c.session_id == _S.c.id).scalar_subquery()
    if name == "trained":  # an eval session is never trained, whatever its turns' loss mask says
        return case((func.coalesce(_K.c.kind, "train") == "eval", 0), else_=found)
    return found


def list_sessions(store: EventStore, run: str, q: SessionQuery, decoder: TokenDecoder) -> SessionPage:
    """The page of sessions of ``run`` that ``q`` asks for."""
    r = store.runs.get(run)
    base = _filtered(r.id, q)
    direction = desc if q.descending else asc
    if q.sort in AGGREGATE_SORTS:
        ordered = base.order_by(direction(_aggregate_of_session(q.sort)), _S.c.id)
    else:
        ordered = base.order_by(direction(SORTABLE[q.sort]), _S.c.id)
    with reading(store) as conn:
        agents = [a for (a,) in conn.execute(select(_S.c.agent).where(_S.c.run_id == r.id).distinct()) if a]
        finishes = [
            f for (f,) in conn.execute(select(_S.c.finish_reason).where(_S.c.run_id == r.id).distinct()) if f
        ]
        scanned = candidates = None
        if q.text:
            all_rows = [dict(x._mapping) for x in conn.execute(ordered.limit(MAX_TEXT_SCAN + 1))]
            candidates = len(all_rows)
            all_rows = all_rows[:MAX_TEXT_SCAN]
            scanned = len(all_rows)
        else:
            total = conn.execute(select(func.count()).select_from(base.subquery())).scalar_one()
            offset = (q.page - 1) * q.per_page
            all_rows = [dict(x._mapping) for x in conn.execute(ordered.limit(q.per_page).offset(offset))]
    if q.text:
        matched = _text_matches(store, r.id, all_rows, q.text, decoder)
        total = len(matched)
        offset = (q.page - 1) * q.per_page
        rows = matched[offset : offset + q.per_page]
    else:
        rows = all_rows
    if rows:
        with reading(store) as conn:
            agg_rows = conn.execute(_aggregates(r.id, [x["session"] for x in rows])).all()
        by_id = {a.session_id: a for a in agg_rows}
        for row in rows:
            a = by_id.get(row["session"])
            trained = a.trained if a and row.get("kind") != "eval" else 0
            row.update(turns=a.turns if a else 0, tokens=a.tokens if a else 0, trained=trained)
    for row in rows:
        for name in ("turns", "tokens", "trained"):
            row[name] = int(row.get(name) or 0)
    return SessionPage(rows, int(total), q, scanned, candidates, sorted(agents), sorted(finishes))


def _text_matches(
    store: EventStore, run_id: int, rows: list[dict[str, Any]], text: str, decoder: TokenDecoder
) -> list[dict[str, Any]]:
    """The rows whose conversation (decoded tokens), error or task payload contains ``text``."""
    needle = text.casefold()
    ids = [x["session"] for x in rows]
    texts: dict[str, list[str]] = {sid: [] for sid in ids}
    for start in range(0, len(ids), 200):
        for turn in store.turns.read(session_ids=ids[start : start + 200], with_experts=False):
            texts[turn.session_id].append(decoder.text(turn.context_ids))
            texts[turn.session_id].append(decoder.text(turn.generated_ids))
    with reading(store) as conn:
        payloads = (
            dict(
                conn.execute(
                    select(_S.c.id, _K.c.payload)
                    .select_from(_S.join(_K, _K.c.id == _S.c.task_id))
                    .where(_S.c.run_id == run_id, _S.c.id.in_(ids))
                ).all()
            )
            if ids
            else {}
        )
    out = []
    for row in rows:
        hay = texts[row["session"]] + [row.get("error") or ""]
        if row["session"] in payloads:
            hay.append(orjson.dumps(payloads[row["session"]]).decode())
        if any(needle in h.casefold() for h in hay):
            out.append(row)
    return out
