"""What the viewer's pages show, read from the log (runs, failures, reward curves, groups, steps).

Every function takes an :class:`~dressage.store.EventStore` opened read-only
(:func:`~dressage.view.readonly.open_readonly_store`) and returns plain typed records the templates
render. The SQL each session page rests on is in :func:`session_sql`, shown behind the page's "SQL"
link so a reader can get the same rows with ``dressage-worker sql``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import and_, func, select

from dressage.store import EventStore, schema
from dressage.store.decisions import SegmentDecision
from dressage.store.records import SESSION_STATUSES, ArtifactRef, Run, RunSummary, Session, TrainStep
from dressage.training.advantages import grpo
from dressage.view.readonly import reading

_S, _K, _T, _E = schema.sessions, schema.tasks, schema.turns, schema.events
FAILURE_KINDS = {
    "agent_crashed": "agent crash",
    "agent_error": "agent crash",
    "sandbox_failed": "sandbox",
    "agent_timeout": "timeout",
    "context_length_exceeded": "overflow",
    "lease_expired": "abandoned",
}


@dataclass(frozen=True)
class RunOverview:
    """One row of the runs page: a run and the store's summary of it, plus the derived figures the
    page shows (every status counted, zero included; the trained share; the eval session count)."""

    run: Run
    summary: RunSummary

    @property
    def sessions(self) -> dict[str, int]:
        """Sessions by status, every status present (zero when none)."""
        return {k: self.summary.sessions.get(k, 0) for k in SESSION_STATUSES}

    @property
    def trained_share(self) -> float | None:
        """Trained tokens (of training sessions: eval sessions are never trained) over all tokens."""
        s = self.summary
        return s.trained_tokens / s.tokens if s.tokens else None

    @property
    def n_sessions(self) -> int:
        """Sessions in any status."""
        return sum(self.summary.sessions.values())

    @property
    def eval_sessions(self) -> int:
        """Eval sessions in any status."""
        return sum(self.summary.eval_sessions.values())


def run_overview(store: EventStore, run: Run) -> RunOverview:
    """Counts of one run (sessions by status, turns, tokens, trained share, mean reward of training
    sessions; eval sessions and their mean reward apart)."""
    return RunOverview(run, store.runs.summary(run))


@dataclass
class FailureGroup:
    """Failed or abandoned sessions of one kind (agent crash, sandbox, timeout, overflow, abandoned)."""

    kind: str
    status: str
    reason: str
    count: int
    sessions: list[str]


def failure_kind(status: str, reason: str | None) -> str:
    """The failure category of a session's status and finish reason."""
    if status == "abandoned":
        return "abandoned"
    reason = reason or ""
    if reason in FAILURE_KINDS:
        return FAILURE_KINDS[reason]
    for word, kind in (("sandbox", "sandbox"), ("timeout", "timeout"), ("context", "overflow")):
        if word in reason:
            return kind
    return "other"


def failures(store: EventStore, run: Run, *, examples: int = 5) -> list[FailureGroup]:
    """Failed and abandoned sessions grouped by kind and reason, with a few session ids each."""
    with reading(store) as conn:
        rows = conn.execute(
            select(_S.c.id, _S.c.status, _S.c.finish_reason)
            .where(_S.c.run_id == run.id, _S.c.status.in_(("failed", "abandoned")))
            .order_by(_S.c.created_at, _S.c.id)
        ).all()
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for sid, status, reason in rows:
        groups[(status, reason or "-")].append(sid)
    out = [
        FailureGroup(failure_kind(status, reason), status, reason, len(ids), ids[:examples])
        for (status, reason), ids in groups.items()
    ]
    return sorted(out, key=lambda g: (-g.count, g.kind, g.reason))


@dataclass
class CurvePoint:
    """Mean reward of the finished sessions at one x (policy version or training step)."""

    x: int
    mean_reward: float
    n: int


def reward_by_version(store: EventStore, run: Run) -> list[CurvePoint]:
    """Mean reward of finished training sessions by the newest policy version that generated their
    tokens (eval sessions apart: :func:`eval_by_version`)."""
    return [CurvePoint(*x) for x in store.sessions.rewards_by_version(run, "train")]


def eval_by_version(store: EventStore, run: Run) -> list[CurvePoint]:
    """Mean reward of finished eval sessions by the policy version they evaluate (the eval curve)."""
    return [CurvePoint(*x) for x in store.sessions.rewards_by_version(run, "eval")]


def consumers(store: EventStore, run: Run) -> list[str]:
    """Names of the consumers (trainers) that recorded steps on ``run``."""
    c = schema.train_steps.c
    with reading(store) as conn:
        return [x for (x,) in conn.execute(select(c.consumer).where(c.run_id == run.id).distinct())]


def steps(store: EventStore, run: Run, consumer: str) -> list[TrainStep]:
    """Every step of ``consumer`` on ``run``, in order."""
    return store.consumers.steps(run, consumer)


def step_rewards(step: TrainStep) -> CurvePoint | None:
    """Mean reward of the finished members of the groups a step kept."""
    rewards = [
        m["reward"]
        for g in step.manifest.get("groups", [])
        if g.get("kept")
        for m in g.get("members", [])
        if m.get("status") == "finished" and m.get("reward") is not None
    ]
    if not rewards:
        return None
    return CurvePoint(step.step, sum(rewards) / len(rewards), len(rewards))


@dataclass
class StepUse:
    """A step that trained on a session: consumer, step and the session's segments in it."""

    consumer: str
    step: int
    segments: list[int]
    advantage: float | None
    nodes: list[NodeAdvantage] = field(default_factory=list)
    """In a trained tree: the nodes holding the session (one advantage each; ``advantage`` is None)."""


def steps_of_session(store: EventStore, run: Run, session_id: str) -> list[StepUse]:
    """The optimizer steps whose manifests list ``session_id``."""
    out = []
    for consumer in consumers(store, run):
        for step in steps(store, run, consumer):
            samples = [x for x in step.manifest.get("samples", []) if x.get("session") == session_id]
            if samples:
                tree = _tree_holding(step, session_id)
                nodes = _nodes_of(tree, session_id) if tree is not None else []
                advantage = None if nodes else _advantage(step, session_id)
                out.append(StepUse(consumer, step.step, [x["segment"] for x in samples], advantage, nodes))
    return out


def _advantage(step: TrainStep, session_id: str) -> float | None:
    rid = next(
        (x["rollout_id"] for x in step.manifest.get("samples", []) if x.get("session") == session_id), None
    )
    for g in step.manifest.get("groups", []):
        adv = g.get("advantages") or {}
        if rid is not None and str(rid) in adv:
            return float(adv[str(rid)])
    return None


def session_events(store: EventStore, run: Run, session_id: str) -> list[dict[str, Any]]:
    """The session's events other than turns (start, reward, overflow, finalize...), in log order."""
    with reading(store) as conn:
        rows = conn.execute(
            select(_E.c.position, _E.c.kind, _E.c.payload, _E.c.created_at)
            .where(_E.c.run_id == run.id, _E.c.session_id == session_id, _E.c.kind != "turn")
            .order_by(_E.c.position)
        ).all()
    return [{"position": p, "kind": k, "payload": pl, "created_at": c} for p, k, pl, c in rows]


def turns_with_experts(store: EventStore, session_id: str) -> set[int]:
    """Turn indexes of ``session_id`` that recorded routed experts (without reading the blobs)."""
    with reading(store) as conn:
        rows = conn.execute(
            select(_T.c.turn_index).where(_T.c.session_id == session_id, _T.c.experts.is_not(None))
        )
        return {int(x) for (x,) in rows}


def artifact_by_id(store: EventStore, artifact_id: int) -> ArtifactRef | None:
    """The artifact with database id ``artifact_id``, or None."""
    a = schema.artifacts.c
    with reading(store) as conn:
        row = conn.execute(select(schema.artifacts).where(a.id == artifact_id)).first()
    if row is None:
        return None
    return ArtifactRef(row.id, row.session_id, row.name, row.sha256, row.size, row.media_type, row.uri)


def task_of(store: EventStore, session: Session) -> dict[str, Any] | None:
    """The session's task row (index, group, sample, payload), or None."""
    if session.task_id is None:
        return None
    with reading(store) as conn:
        row = conn.execute(select(_K).where(_K.c.id == session.task_id)).first()
    return dict(row._mapping) if row is not None else None


@dataclass(frozen=True)
class NodeAdvantage:
    """One node of a trained tree a session holds (docs/trees.md): its turns ``[first, end)``, its
    value and advantage, and the session whose sample trains it (the others mask it ``tree_shared``)."""

    first_turn: int
    end_turn: int
    value: float
    advantage: float
    trained_in: str

    @property
    def turns(self) -> str:
        """``turn 2`` or ``turns 0-1``."""
        last = self.end_turn - 1
        return f"turn {self.first_turn}" if last <= self.first_turn else f"turns {self.first_turn}-{last}"


@dataclass
class GroupMember:
    """One session of a group: a sample (a root) or, in a tree, a fork below one; its reward and the
    advantage its segments got (one per node for a tree the trainer trained)."""

    session: Session
    sample_index: int
    n_turns: int
    advantage: float | None
    advantage_source: str
    segments: list[int] = field(default_factory=list)
    depth: int = 0
    nodes: list[NodeAdvantage] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``sample 0``, or ``sample 0 · fork at turn 2`` for a session forked in its tree."""
        fork = f" · fork at turn {self.session.fork_turn}" if self.depth else ""
        return f"sample {self.sample_index}{fork}"


def _group_sessions(store: EventStore, run: Run, group_index: int) -> list[tuple[Session, int, int]]:
    """``(session, sample index, depth)`` of the group's training sessions, each sample's attempts
    in order, each followed by the sessions forked below it (depth first: a fork carries no task of
    its own, its tree's root does)."""
    with reading(store) as conn:
        rows = conn.execute(
            select(_S.c.id, _K.c.sample_index)
            .select_from(_S.join(_K, _K.c.id == _S.c.task_id))
            .where(_S.c.run_id == run.id, _K.c.group_index == group_index, _K.c.kind == "train")
            .order_by(_K.c.sample_index, _S.c.attempt)
        ).all()
    out: list[tuple[Session, int, int]] = []
    seen: set[str] = set()
    for sid, sample in rows:
        if sid in seen:
            continue
        tree = store.sessions.tree(sid)
        depth = {tree[0].id: 0}
        for s in tree:
            if s.parent_session_id in depth:
                depth[s.id] = depth[s.parent_session_id] + 1
            if s.id not in seen:
                seen.add(s.id)
                out.append((s, int(sample), depth.get(s.id, 0)))
    return out


def _tree_of(step: TrainStep, group_index: int) -> dict[str, Any] | None:
    """The tree a step's decision recorded for the group (None: not in the step, or no tree)."""
    for g in step.manifest.get("groups", []):
        if g.get("group_index", g.get("task_index")) == group_index and isinstance(g.get("tree"), dict):
            return dict(g["tree"])
    return None


def _nodes_of(tree: dict[str, Any], session_id: str) -> list[NodeAdvantage]:
    """The nodes of ``tree`` holding ``session_id``'s turns (it is a leaf below them, or their owner)."""
    held = [
        n for n in tree.get("nodes", []) if session_id in n.get("leaves", ()) or n.get("owner") == session_id
    ]
    return sorted(
        (NodeAdvantage(int(n["turns"][0]), int(n["turns"][1]), float(n["value"]), float(n["advantage"]),
                       str(n["trained_in"])) for n in held),
        key=lambda n: n.first_turn,
    )  # fmt: skip


def _tree_holding(step: TrainStep, session_id: str) -> dict[str, Any] | None:
    """The tree of the step's group that holds ``session_id`` (None: no tree of the step does)."""
    for g in step.manifest.get("groups", []):
        tree = g.get("tree")
        if isinstance(tree, dict) and _nodes_of(tree, session_id):
            return dict(tree)
    return None


def tree_nodes_of_session(
    store: EventStore, run: Run, session_id: str, decisions: dict[int, SegmentDecision]
) -> dict[int, list[dict[str, Any]]]:
    """Per segment of ``session_id`` that a step trained in a tree (docs/trees.md), the nodes of
    that tree holding the session: turns, advantage, and whether another session trains it."""
    by_step: dict[tuple[str, int], list[NodeAdvantage]] = {}
    out: dict[int, list[dict[str, Any]]] = {}
    for segment, d in decisions.items():
        key = (d.consumer, d.step)
        if key not in by_step:
            step = next((s for s in steps(store, run, d.consumer) if s.step == d.step), None)
            tree = _tree_holding(step, session_id) if step is not None else None
            by_step[key] = _nodes_of(tree, session_id) if tree is not None else []
        if by_step[key]:
            out[segment] = [
                {"first_turn": n.first_turn, "end_turn": n.end_turn, "turns": n.turns, "advantage": n.advantage,
                 "shared": n.trained_in != session_id}
                for n in by_step[key]
            ]  # fmt: skip
    return out


_Recorded = tuple[float | None, list[int], str, list[NodeAdvantage]]


def _recorded_advantages(
    store: EventStore, run: Run, group_index: int, session_ids: list[str]
) -> dict[str, _Recorded]:
    """Per session, what the first step that trained it recorded: its advantage (None in a tree),
    its segments, which step, and its tree nodes (one advantage each)."""
    recorded: dict[str, _Recorded] = {}
    for consumer in consumers(store, run):
        for step in steps(store, run, consumer):
            tree = _tree_of(step, group_index)
            for sid in session_ids:
                adv = _advantage(step, sid)
                nodes = _nodes_of(tree, sid) if tree is not None else []
                if (adv is not None or nodes) and sid not in recorded:
                    segs = [x["segment"] for x in step.manifest["samples"] if x.get("session") == sid]
                    source = f"{consumer} step {step.step}" + (
                        " (tree: one advantage per node)" if nodes else ""
                    )
                    recorded[sid] = (None if nodes else adv, segs, source, nodes)
    return recorded


def group_members(store: EventStore, run: Run, group_index: int) -> list[GroupMember]:
    """The training sessions of group ``group_index``, a tree's forks included: recorded advantages
    when a step used them (per node for a tree), else GRPO's. Eval sessions share group indexes with
    training tasks but are never trained, so they are no members (an advantage would be made up)."""
    found = _group_sessions(store, run, group_index)
    with reading(store) as conn:
        counts: dict[str, int] = (
            dict(
                conn.execute(
                    select(_T.c.session_id, func.count())
                    .where(and_(_T.c.run_id == run.id, _T.c.session_id.in_([s.id for s, _, _ in found])))
                    .group_by(_T.c.session_id)
                ).all()
            )
            if found
            else {}
        )
    members = [
        GroupMember(session, sample, int(counts.get(session.id, 0)), None, "-", depth=depth)
        for session, sample, depth in found
    ]
    forked = any(m.depth for m in members)
    recorded = _recorded_advantages(store, run, group_index, [m.session.id for m in members])
    finished = [m for m in members if m.session.status == "finished" and m.session.reward is not None]
    computed: dict[str, float] = {}
    if finished and not forked:  # a tree's advantages are per node: only the trainer's are shown
        rewards_G = np.asarray([m.session.reward for m in finished], dtype=np.float64)
        adv_G = grpo(rewards_G, std_normalize=False, eps=1e-6)
        computed = {m.session.id: float(a) for m, a in zip(finished, adv_G, strict=True)}
    for m in members:
        if m.session.id in recorded:
            m.advantage, m.segments, m.advantage_source, m.nodes = recorded[m.session.id]
        elif m.session.id in computed:
            m.advantage, m.advantage_source = computed[m.session.id], "GRPO R - mean(R), not trained yet"
        elif forked:
            m.advantage_source = "a tree: per-node advantages once a step trains it"
    return members


def session_sql(session_id: str) -> str:
    """The SQL that returns the rows the session page shows (for ``dressage-worker sql``)."""
    quoted = session_id.replace("'", "''")
    return (
        f"-- the session\nSELECT * FROM sessions WHERE id = '{quoted}';\n\n"
        f"-- its turns (per-token arrays included)\nSELECT turn_index, thread_index, route, segment_index, "
        f"segment_offset, boundary_reason,\n       n_context, n_generated, n_trained, finish_reason, latency_ms\n"
        f"FROM turns WHERE session_id = '{quoted}' ORDER BY turn_index;\n\n"
        f"-- one row per token (the token view)\nSELECT segment_index, turn_index, position, token_id, logprob, "
        f"loss_mask, policy_version\nFROM token_events WHERE session_id = '{quoted}' "
        f"ORDER BY segment_index, position;\n\n"
        f"-- its events (start, reward, overflow, finalize)\nSELECT position, kind, payload FROM events "
        f"WHERE session_id = '{quoted}' ORDER BY position;\n\n"
        f"-- its artifacts\nSELECT name, sha256, size, media_type, uri FROM artifacts WHERE session_id = '{quoted}';"
    )
