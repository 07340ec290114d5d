"""Tree rollouts: one training sample grows a tree of forks under its lease (``branching:``).

The sample's root session is played as any episode, but its lease is kept; then, breadth first,
every finished session of level ``< depth`` (the root is level 0) forks at its fork points
(:meth:`~dressage.rollout.config.BranchingConfig.fork_turns`, a function of its recorded turns)
into ``width`` branches (:mod:`dressage.rollout.fork`: the first ``K`` turns replayed from the log,
turn ``K`` on live), one fork point at a time, its branches concurrently. With ``token_budget``,
no fork point opens once the tree's sessions generated that many tokens (their own turns: replayed
ones cost the engine nothing). When every branch has ended the lease is released ``done``, which
is when the trainer's group tracker counts the sample ready (docs/trees.md).

Crash safety: fork points, branch session ids and seeds are functions of the log, so a worker that
reclaims the sample after a crash walks the same tree: the root is taken over or found finished,
a branch that ended is left as it is, one left ``running`` is taken over (its recorded turns
replayed, none generated twice), one never opened is opened. A branch that could not be played
(an error, not a failed agent) releases the sample for a retry, which continues the tree.
"""

from __future__ import annotations

import asyncio
import logging

from dressage.errors import LeaseError, StoreError
from dressage.rollout.config import BranchingConfig
from dressage.rollout.episode import EpisodeEnv, Outcome, renew_lease, run_episode
from dressage.rollout.fork import ForkSpec, plan_fork, run_branches
from dressage.store import EventStore, Session, TaskLease

log = logging.getLogger(__name__)


async def run_tree(env: EpisodeEnv, lease: TaskLease) -> Outcome:
    """Play the sample's root, then its tree of forks; release the lease when the tree has ended."""
    branching = env.cfg.branching
    assert branching is not None, "run_tree needs a branching: section"
    root_outcome = await run_episode(env, lease, release=False)
    if root_outcome.status not in ("finished", "skipped"):
        return root_outcome  # failed (released for a retry) or lost: no tree to grow
    root = await asyncio.to_thread(env.store.sessions.finished_session, lease.task_id)
    if root is None:
        return Outcome("lease_lost", error=f"task {lease.task_id}: its finished root session is gone")
    current = asyncio.current_task()
    assert current is not None
    lost = [False]
    renewer = asyncio.create_task(renew_lease(env, lease, current, lost))
    try:
        errors = await grow_tree(env, root, branching)
        renewer.cancel()
        if errors:
            await asyncio.to_thread(
                env.store.tasks.release, lease, "retry", max_attempts=env.cfg.worker.max_attempts
            )
            return Outcome("error", error=errors[-1])
        await asyncio.to_thread(env.store.tasks.release, lease, "done")
        return Outcome("finished", reward=root.reward)
    except asyncio.CancelledError:
        if not lost[0]:
            raise
        return Outcome("lease_lost", error=f"lease of task {lease.task_id} lost while growing its tree")
    except (LeaseError, StoreError) as e:
        return Outcome("lease_lost", error=str(e))
    finally:
        renewer.cancel()


async def grow_tree(env: EpisodeEnv, root: Session, branching: BranchingConfig) -> list[str]:
    """Fork the tree below ``root`` breadth first; returns the errors of branches that could not play."""
    store = env.store
    tree = [root.id]
    frontier: list[tuple[str, int, int]] = [(root.id, 0, 0)]  # (session, level, its fork turn)
    errors: list[str] = []
    while frontier:
        sid, level, own_from = frontier.pop(0)
        if level >= branching.depth:
            continue
        turns = sorted(
            await asyncio.to_thread(store.turns.read, session_ids=[sid]), key=lambda t: t.turn_index
        )
        for fork_turn in branching.fork_turns([t.logprobs for t in turns], own_from):
            budget = branching.token_budget
            if budget is not None and await asyncio.to_thread(generated_tokens, store, tree) >= budget:
                return errors
            spec = ForkSpec(sid, fork_turn, branching.width, resume=True)
            plan = await asyncio.to_thread(plan_fork, store, spec)
            report = await run_branches(env, plan)
            for branch in plan.branches:
                outcome = report.outcomes[branch.session_id]
                if outcome.status == "error":
                    errors.append(outcome.error or f"branch {branch.session_id} failed to play")
                    continue
                tree.append(branch.session_id)
                session = await asyncio.to_thread(store.sessions.get, branch.session_id)
                if session.status == "finished":
                    frontier.append((branch.session_id, level + 1, fork_turn))
    return errors


def generated_tokens(store: EventStore, session_ids: list[str]) -> int:
    """Tokens the engine generated for these sessions: their own turns (not the replayed ones)."""
    sessions = {sid: store.sessions.get(sid) for sid in session_ids}
    return sum(
        int(t.generated_ids.size)
        for t in store.turns.read(session_ids=session_ids)
        if t.turn_index >= (sessions[t.session_id].fork_turn or 0)
    )
