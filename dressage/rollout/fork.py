"""Forks of a recorded session: ``dressage-worker fork SESSION --at-turn K --branches N``.

A fork (a *child*) is a new session whose row names its parent (``parent_session_id``) and its
fork turn K (``fork_turn``). Its agent runs again, in a fresh sandbox, with the parent's task and
the parent run's agent and sandbox config; the proxy answers its first K requests with the
parent's recorded turns and copies them into the child id for id (no engine request, no new
generated token: :mod:`dressage.proxy.fork_replay`), so the agent's tools re-run against the same
replies and the workspace at turn K is the parent's. Turn K onward is live, sampled with the
branch's own seed (the agent's requests carry it; a CLI agent, which sends none, gets it from the
session's ``info["sampling_seed"]``).

Branch ``i`` of a fork has a deterministic session id (:func:`branch_session_id`: parent, fork
turn, branch index, seed), so running the same fork again finds its branches: one that ended is
left as it is, one still ``running`` (its worker died) is taken over with ``resume=True`` (its
recorded turns are replayed, copied or live, and it continues), one never opened is opened. Every
branch ends exactly once, and no recorded turn is generated twice.

With the parent's sandbox checkpoint at K and an agent that can resume (``--from-checkpoint``,
the default), a branch starts from the checkpoint instead (:mod:`dressage.rollout.checkpointing`):
its turns ``0..K-1`` are copied when it is opened, its sandbox is restored, its agent resumes from
the recorded request K, and the proxy checks that request against the parent's token for token
(:mod:`dressage.proxy.checkpoint_start`); if it differs, or the restore fails, the branch is taken
over by a new attempt that replays. ``info["start"]`` records the path each branch took and why.

A child is no entry of its run's task queue (``task_id`` is NULL, so the queue's retries and
in-flight resume never mistake it for its parent's attempt); its ``info`` keeps the parent's
``task_index``, ``sample_index`` and ``group_index`` and, under ``fork``, the branch index, its
seed and the queue entry of the task (``task_id``, of the root's run). A child whose agent did
not replay the parent's turns ends ``failed`` with finish reason ``fork_diverged`` and says at
which turn; nothing live is recorded before its fork turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from dressage.agents import AgentLog, Task
from dressage.errors import ConfigError, DressageError, LeaseError, UnknownSessionError
from dressage.proxy.checkpoint_start import CHECKPOINT_DIVERGED
from dressage.proxy.contract import SessionHandle
from dressage.proxy.fork_replay import copy_prefix
from dressage.redact import redact, redact_json
from dressage.rollout.checkpointing import (
    FALLBACK_REASONS,
    StartPoint,
    load_start,
    provider_refusal,
    replay_info,
)
from dressage.rollout.config import RolloutConfig, parse_config, session_seed
from dressage.rollout.episode import (
    EpisodeEnv,
    EpisodeFailed,
    Held,
    Outcome,
    archive_session,
    play_agent,
    score_result,
)
from dressage.store import EventStore, Session, deterministic_key
from dressage.store.sessions import seed_attempt

log = logging.getLogger(__name__)

FORK_DIVERGED = "fork_diverged"
"""Finish reason of a child whose agent did not replay its parent's first turns."""


@dataclass(frozen=True)
class ForkSpec:
    """What to fork: ``branches`` children of ``parent_session_id`` sharing its first ``fork_turn`` turns.

    ``seed``: branch ``i`` samples with ``seed + i`` (None: the parent's seed + 1 + i when its run
    has a sampling seed, else the engine's own draw). ``into``: the run the children are recorded
    in (default: the parent's; created with the parent run's config when absent). ``resume``:
    continue the branches of an earlier run of the same fork instead of refusing.
    """

    parent_session_id: str
    fork_turn: int
    branches: int = 1
    seed: int | None = None
    into: str | None = None
    resume: bool = False
    from_checkpoint: bool = True
    """Start each branch from the parent's sandbox checkpoint at the fork turn when there is one and
    the agent can resume (``--from-checkpoint``, the default); False: replay (``--replay``)."""


@dataclass(frozen=True)
class Branch:
    """One child of a fork: its index, deterministic session id and sampling seed."""

    index: int
    session_id: str
    seed: int | None


@dataclass
class ForkPlan:
    """A checked fork: the parent, its task, the config the children run with, the branches."""

    spec: ForkSpec
    parent: Session
    cfg: RolloutConfig
    run_name: str
    run_config: dict[str, object]
    task: Task
    task_id: int
    parent_info: dict[str, Any]
    branches: list[Branch]


@dataclass
class ForkReport:
    """What a fork did: each branch's outcome by session id (``ended`` for one that had ended before)."""

    run: str
    parent_session_id: str
    fork_turn: int
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    interrupted: str | None = None
    """Why the fork stopped before its branches ended (a signal, a stop request); None otherwise."""


def branch_session_id(parent_session_id: str, fork_turn: int, branch: int, seed: int | None) -> str:
    """The session id of branch ``branch`` of a fork (the same every time the fork runs)."""
    ident = f"fork\0{parent_session_id}\0{fork_turn}\0{branch}\0{seed}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def branch_seeds(spec: ForkSpec, parent_seed: int | None) -> list[int | None]:
    """Each branch's sampling seed (see :class:`ForkSpec`)."""
    if spec.seed is not None:
        return [spec.seed + i for i in range(spec.branches)]
    if parent_seed is not None:
        return [(parent_seed + 1 + i) % (2**31 - 1) for i in range(spec.branches)]
    return [None] * spec.branches


def plan_fork(store: EventStore, spec: ForkSpec) -> ForkPlan:
    """Check a fork against the log (parent, fork turn, its run's config, its task) and plan its branches.

    Raises :class:`ConfigError` naming the option at fault; refuses branches that exist already
    unless ``spec.resume``.
    """
    if spec.branches < 1:
        raise ConfigError(f"--branches must be >= 1, got {spec.branches}")
    if spec.fork_turn < 0:
        raise ConfigError(f"--at-turn must be >= 0, got {spec.fork_turn}")
    try:
        parent = store.sessions.get(spec.parent_session_id)
    except UnknownSessionError as e:
        raise ConfigError(f"SESSION: {e}") from e
    recorded = store.sessions.head(parent.id).turns
    if spec.fork_turn > recorded:
        raise ConfigError(
            f"--at-turn {spec.fork_turn} is past session {parent.id}'s {recorded} recorded turns"
        )
    if spec.fork_turn == recorded:
        raise ConfigError(
            f"--at-turn {spec.fork_turn} forks after the last of session {parent.id}'s {recorded} recorded "
            f"turns: a branch would replay them all and generate no new token; fork at a turn "
            f"below {recorded}" + (f" (0..{recorded - 1})" if recorded else "")
        )
    parent_run = store.runs.by_id(parent.run_id)
    stored = parent_run.config.get("rollout")
    if not isinstance(stored, dict):
        raise ConfigError(f"session {parent.id}'s run {parent_run.name!r} has no rollout config to fork with")
    cfg = parse_config(stored, source=f"run {parent_run.name!r} snapshot")
    task_id, parent_info = _origin(store, parent)
    task = Task.from_payload(store.tasks.payload_of(task_id))
    run_name, run_config = _target_run(store, spec.into, parent_run.name, parent_run.config)
    seed = _parent_seed(cfg, parent, parent_info)
    branches = [
        Branch(i, branch_session_id(parent.id, spec.fork_turn, i, s), s)
        for i, s in enumerate(branch_seeds(spec, seed))
    ]
    _check_existing(store, spec, branches, run_name)
    return ForkPlan(spec, parent, cfg, run_name, run_config, task, task_id, parent_info, branches)


def _origin(store: EventStore, parent: Session) -> tuple[int, dict[str, Any]]:
    """The queue entry of the parent's task (a fork's parent may be a fork: its ``info`` says) and
    the queue facts its ``info`` keeps (task, sample and group index)."""
    found = parent.info.get("fork")
    fork_info: dict[str, Any] = found if isinstance(found, dict) else {}
    task_id = parent.task_id if parent.task_id is not None else fork_info.get("task_id")
    if not isinstance(task_id, int):
        raise ConfigError(f"session {parent.id} has no task in the queue to fork")
    keep = ("task_index", "sample_index", "group_index", "eval_version")
    return task_id, {k: parent.info[k] for k in keep if k in parent.info}


def _target_run(
    store: EventStore, into: str | None, parent_run: str, parent_config: dict[str, Any]
) -> tuple[str, dict[str, object]]:
    """The run the children go to and the config it is created (or got) with."""
    if into is None or into == parent_run:
        return parent_run, parent_config
    if into in {r.name for r in store.runs.list()}:
        return into, store.runs.get(into).config
    rollout = dict(parent_config["rollout"])
    rollout["run"] = into
    return into, {**parent_config, "rollout": rollout}


def _parent_seed(cfg: RolloutConfig, parent: Session, info: dict[str, Any]) -> int | None:
    """The seed the parent's requests carried (None when its run has no sampling seed)."""
    own = parent.info.get("sampling_seed")
    if isinstance(own, int):
        return own
    if cfg.sampling.seed is None:
        return None
    return session_seed(
        cfg.sampling.seed,
        int(info.get("task_index", 0)),
        int(info.get("sample_index", 0)),
        seed_attempt(parent),
    )


def _check_existing(store: EventStore, spec: ForkSpec, branches: list[Branch], run_name: str) -> None:
    """Branches that exist already: refused without ``--resume``, and anywhere but ``run_name``."""
    existing = []
    for b in branches:
        try:
            existing.append(store.sessions.get(b.session_id))
        except UnknownSessionError:
            continue
    if not existing:
        return
    if not spec.resume:
        raise ConfigError(
            f"session {spec.parent_session_id} was already forked at turn {spec.fork_turn} with these branches "
            f"({', '.join(s.id for s in existing)}); add --resume to continue them"
        )
    target = store.runs.get(run_name).id
    for s in existing:
        if s.run_id != target:
            raise ConfigError(f"branch session {s.id} is recorded in another run than {run_name!r}")


async def run_branches(env: EpisodeEnv, plan: ForkPlan) -> ForkReport:
    """Play every branch of ``plan`` with ``env`` (a worker's engine, proxy and agent)."""
    report = ForkReport(env.run.name, plan.parent.id, plan.spec.fork_turn)
    gate = asyncio.Semaphore(env.cfg.worker.concurrency)

    async def one(branch: Branch) -> None:
        async with gate:
            try:
                report.outcomes[branch.session_id] = await run_branch(env, plan, branch)
            except DressageError as e:
                report.outcomes[branch.session_id] = Outcome(
                    "error", error=redact(str(e), env.store.db.secrets)
                )

    await asyncio.gather(*(one(b) for b in plan.branches))
    return report


async def run_branch(env: EpisodeEnv, plan: ForkPlan, branch: Branch) -> Outcome:
    """Open (or take over, or leave as it ended) branch ``branch`` and play it to its end."""
    opened = await _open_branch(env, plan, branch)
    if isinstance(opened, Outcome):
        return opened
    handle, attempt, start = opened
    sid, agent_log, held = handle.session_id, AgentLog(), Held()
    sampling = env.cfg.sampling.request_kwargs(
        task_index=int(plan.parent_info.get("task_index", 0)),
        sample_index=int(plan.parent_info.get("sample_index", 0)),
    )
    if branch.seed is not None:
        sampling["seed"] = branch.seed
    try:
        try:
            try:
                result = await play_agent(env, plan.task, handle, agent_log, held, sampling, start)
            except EpisodeFailed as f:
                why = await _checkpoint_failure(env, sid, f) if start is not None else None
                if why is None:
                    raise
                agent_log.write(f"checkpoint start failed, replaying: {why}")
                await held.release(sid)
                held = Held()
                attempt += 1
                handle = await env.proxy.take_over_session(sid, attempt=attempt, info=replay_info(why))
                result = await play_agent(env, plan.task, handle, agent_log, held, sampling)
            await _check_shared(env, plan, sid)
            reward, details = await score_result(env, plan.task, result, held)
        except EpisodeFailed as f:
            reason, error = await _failure(env, plan, sid, f)
            agent_log.write(f"FAILED ({reason}): {error}")
            await archive_session(env, sid, held.sandbox, agent_log)
            info = _branch_info(env, plan, branch)
            await env.proxy.finalize_session(
                sid, "failed", finish_reason=reason, error=error, info=info, attempt=attempt
            )
            return Outcome("failed", error=error)
        await asyncio.to_thread(
            env.store.events.append,
            env.run,
            "reward",
            redact_json({"reward": reward, "details": details}, env.store.db.secrets),
            key=deterministic_key(env.run.name, sid, "reward"),
            session_id=sid,
        )
        await archive_session(env, sid, held.sandbox, agent_log)
        info = {
            **_branch_info(env, plan, branch),
            "turns": result.turns,
            "agent_finish_reason": result.finish_reason,
        }
        await env.proxy.finalize_session(
            sid,
            "finished",
            reward=reward,
            finish_reason=result.finish_reason,
            info=redact_json(info, env.store.db.secrets),
            attempt=attempt,
        )
        return Outcome("finished", reward=reward)
    finally:
        await held.release(sid)


async def _open_branch(
    env: EpisodeEnv, plan: ForkPlan, branch: Branch
) -> tuple[SessionHandle, int, StartPoint | None] | Outcome:
    """The branch's session: opened (from the parent's checkpoint at the fork turn, its shared turns
    copied at once, or to replay them), taken over (running: its worker died; it replays), or its
    outcome (ended)."""
    store = env.store
    try:
        old = await asyncio.to_thread(store.sessions.get, branch.session_id)
    except UnknownSessionError:
        old = None
    if old is not None and old.status != "running":
        return Outcome("ended", reward=old.reward, error=old.error)
    if old is not None:
        info = {**env.session_info, **replay_info("taken over after the branch's worker stopped")}
        try:
            handle = await env.proxy.take_over_session(old.id, attempt=old.attempt + 1, info=info)
        except LeaseError as e:  # ended, or taken by another process, meanwhile
            return Outcome("ended", error=str(e))
        log.info("fork branch %d of %s: took session %s over", branch.index, plan.parent.id, old.id)
        return handle, old.attempt + 1, None
    start, why = await _branch_start(env, plan)
    handle = await env.proxy.open_session(
        env.run.name,
        session_id=branch.session_id,
        attempt=1,
        agent=env.agent.name,
        sandbox=env.cfg.sandbox.provider,
        info={**_branch_info(env, plan, branch), **(start.info("refuse") if start else replay_info(why))},
        parent_session_id=plan.parent.id,
        fork_turn=plan.spec.fork_turn,
    )
    if start is not None:
        await asyncio.to_thread(_copy_shared, env.store, env.run.name, plan, handle.session_id)
    return handle, 1, start


async def _branch_start(env: EpisodeEnv, plan: ForkPlan) -> tuple[StartPoint | None, str]:
    """The parent's checkpoint at the fork turn to start a branch from, or why it replays."""
    if not plan.spec.from_checkpoint:
        return None, "--replay"
    refusal = provider_refusal(env.cfg.sandbox.provider)
    if refusal is not None:
        return None, refusal
    found = await asyncio.to_thread(load_start, env.store, plan.parent.id, plan.spec.fork_turn, env.agent)
    return (found, "") if isinstance(found, StartPoint) else (None, found)


def _copy_shared(store: EventStore, run_name: str, plan: ForkPlan, session_id: str) -> None:
    """Copy the parent's turns ``0..K-1`` into a branch started from a checkpoint (id for id)."""
    parent_turns = store.turns.read(session_id=plan.parent.id, with_experts=True)
    copy_prefix(store, run_name, store.sessions.get(session_id), parent_turns)


async def _checkpoint_failure(env: EpisodeEnv, sid: str, failed: EpisodeFailed) -> str | None:
    """Why a branch's checkpoint start failed (its restore, or its first request refused), so it
    replays; None: the failure is the agent's own."""
    if failed.reason in FALLBACK_REASONS:
        return str(failed)
    events = await asyncio.to_thread(env.store.events.read, env.run, kinds=(CHECKPOINT_DIVERGED,))
    diverged = [e for e in events if e.session_id == sid]
    return str(diverged[-1].payload.get("error")) if diverged else None


async def _check_shared(env: EpisodeEnv, plan: ForkPlan, sid: str) -> None:
    """The agent ended: it must have replayed all of the parent's shared turns."""
    recorded = (await asyncio.to_thread(env.store.sessions.head, sid)).turns
    if recorded < plan.spec.fork_turn:
        raise EpisodeFailed(
            FORK_DIVERGED,
            f"the agent ended after {recorded} of the {plan.spec.fork_turn} turns it shares with session "
            f"{plan.parent.id}",
        )


async def _failure(env: EpisodeEnv, plan: ForkPlan, sid: str, failed: EpisodeFailed) -> tuple[str, str]:
    """The failed branch's finish reason and error: ``fork_diverged`` (and where) when its proxy
    refused a request that did not replay the parent's turn."""
    events = await asyncio.to_thread(env.store.events.read, env.run, kinds=(FORK_DIVERGED,))
    diverged = [e for e in events if e.session_id == sid]
    if diverged:
        return FORK_DIVERGED, str(diverged[-1].payload.get("error"))
    return failed.reason, redact(str(failed), env.store.db.secrets) or ""


def _branch_info(env: EpisodeEnv, plan: ForkPlan, branch: Branch) -> dict[str, object]:
    """A branch session's ``info``: the worker's, the parent's queue facts, the branch (index, seed,
    task) and the seed the proxy gives requests that name none."""
    info: dict[str, object] = {
        **env.session_info,
        **plan.parent_info,
        "fork": {"branch": branch.index, "seed": branch.seed, "task_id": plan.task_id},
    }
    if branch.seed is not None:
        info["sampling_seed"] = branch.seed
    return info
