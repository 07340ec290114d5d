"""A forked session's first turns: its parent's turns, answered from the log and copied into it.

A fork (``dressage-worker fork``, :mod:`dressage.rollout.fork`) is a new session whose row names
its parent (``parent_session_id``) and how many of the parent's turns it starts with
(``fork_turn`` = K). Its agent starts in a fresh sandbox and sends the requests the parent's agent
sent; while the fork has fewer than K turns, each request must match the parent's next recorded
turn (choice 0, not abandoned) the way a resumed session's requests match its own turns
(:mod:`dressage.proxy.replay`: the same body, or the same prompt ids). A match is answered with the
parent's recorded reply, with no engine request, and the parent's turn is appended to the fork as
the fork's own turn at the same index: context ids, generated ids, logprobs, loss mask, policy
versions, routed experts, placement and finish reason equal the parent's, ``parent_turn_id`` points
at the fork's own copy of the parent's parent turn, and ``info["replayed_from"]`` names the
parent's turn. Turns the parent recorded in between (the further choices of an ``n > 1`` request,
a dead-end turn of a client that went away) are copied with it, so turn ``i < K`` of the fork is
turn ``i`` of the parent, id for id. From turn K on the fork is live.

A request that does not match while turns are still to be copied (the agent is not deterministic,
or its tools are not) is refused with 409 ``fork_diverged`` naming the turn, nothing is recorded
for it, and a ``fork_diverged`` event records where: a fork never mixes live turns into the part
it shares with its parent. The fork's worker finalizes it ``failed`` with that reason.

The state is rebuilt from the log like the rest of
:class:`~dressage.proxy.sessions.SessionState`: the fork's recorded turn count says how far the
copy got, so a proxy restart, or a fork taken over by a new attempt after its worker died, copies
on from there (a taken-over fork first replays its own copied turns as any resumed session does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dressage.errors import ConflictError
from dressage.proxy.replay import (
    ReplayTarget,
    ids_digest,
    prompt_difference,
    recorded_prompt,
    replay_targets,
    request_prompt,
)
from dressage.store import EventStore, NewTurn, Session, Turn, turn_key

if TYPE_CHECKING:
    from dressage.proxy.conversation import Conversation
    from dressage.tito import SegmentIndex

REPLAYED_FROM = "replayed_from"
"""``info`` key of a fork's copied turn: the id of the parent's turn it copies."""


@dataclass
class ForkReplay:
    """The copy state of one fork whose first ``fork_turn`` turns are not all recorded yet."""

    parent_session_id: str
    fork_turn: int
    parent_turns: list[Turn]
    """The parent's turns ``0 .. fork_turn - 1`` (routed experts included), by turn index."""
    targets: list[ReplayTarget]

    def pending(self, next_turn: int) -> bool:
        """Whether turns remain to copy when the fork's next turn index is ``next_turn``."""
        return next_turn < self.fork_turn

    def match(self, index: SegmentIndex, conv: Conversation, next_turn: int) -> list[Turn]:
        """The parent's turns to copy for request ``conv`` (the fork holds ``next_turn`` turns).

        They run from ``next_turn`` through the next target (and its further choices); with no
        target left before the fork turn, the remaining turns (dead ends) and nothing live.
        Raises :class:`ConflictError` (``fork_diverged``) when the request matches no recorded turn.
        """
        target = next((x for x in self.targets if x.turn_index >= next_turn), None)
        if target is None:
            return self.parent_turns[next_turn:]
        if target.fingerprint != conv.fingerprint:
            got = request_prompt(index, conv)
            if ids_digest(got) != target.prompt_digest:
                recorded = recorded_prompt(self.parent_turns, target.turn_index)
                where = prompt_difference(recorded, got, index.profile.tokenizer.decode)
                raise ConflictError(
                    f"fork diverged at turn {target.turn_index}: the agent's request does not match turn "
                    f"{target.turn_index} of parent session {self.parent_session_id} (fork turn "
                    f"{self.fork_turn}), first {where}; nothing was recorded",
                    code="fork_diverged",
                )
        if len(self.parent_choices(target.turn_index)) != conv.n:
            raise ConflictError(
                f"fork diverged at turn {target.turn_index}: the request asks for {conv.n} choices, the parent's "
                f"turn had {len(self.parent_choices(target.turn_index))}",
                code="fork_diverged",
            )
        last = max(t.turn_index for t in self.parent_choices(target.turn_index))
        return self.parent_turns[next_turn : last + 1]

    def parent_choices(self, turn_index: int) -> list[Turn]:
        """The parent's turn ``turn_index`` and its further choices (``n > 1``), within the fork turn."""
        out = [self.parent_turns[turn_index]]
        for turn in self.parent_turns[turn_index + 1 :]:
            choice = turn.info.get("choice") or {}
            if int(choice.get("index", 0)) and choice.get("first") == turn_index:
                out.append(turn)
        return out

    def copy(self, turn: Turn, run_name: str, session_id: str, request_fingerprint: str | None) -> NewTurn:
        """The fork's own record of the parent's ``turn``: the same tokens and placement, its own ids."""
        parent_ids = {t.id: t.turn_index for t in self.parent_turns}
        parent_turn = turn.parent_turn_id
        if parent_turn is not None and parent_turn in parent_ids:
            parent_turn = turn_key(run_name, session_id, parent_ids[parent_turn])
        return NewTurn.from_turn(
            turn,
            session_id,
            info={**turn.info, REPLAYED_FROM: turn.id},
            parent_turn_id=parent_turn,
            request_fingerprint=request_fingerprint,
            latency_ms=0.0,
            key=turn_key(run_name, session_id, turn.turn_index),
        )


def as_recorded(record: NewTurn, parent: Turn) -> Turn:
    """The :class:`Turn` the log holds once ``record`` (a copy of ``parent``) is appended."""
    assert record.key is not None
    return dataclasses.replace(
        parent,
        id=record.key,
        session_id=record.session_id,
        parent_turn_id=record.parent_turn_id,
        request_fingerprint=record.request_fingerprint,
        latency_ms=record.latency_ms,
        info=dict(record.info),
    )


def build_fork_replay(
    session: Session, turns: Sequence[Turn], parent_turns: Sequence[Turn]
) -> ForkReplay | None:
    """The copy state of fork ``session`` (``turns``: its recorded turns, ``parent_turns``: its
    parent's); None when the session is no fork or has all its shared turns."""
    k = session.fork_turn
    if session.parent_session_id is None or k is None or len(turns) >= k:
        return None
    shared = sorted((t for t in parent_turns if t.turn_index < k), key=lambda t: t.turn_index)
    if [t.turn_index for t in shared] != list(range(k)):
        raise ConflictError(
            f"parent session {session.parent_session_id} does not hold turns 0..{k - 1} for fork {session.id}",
            code="fork_parent_incomplete",
        )
    return ForkReplay(session.parent_session_id, k, shared, replay_targets(shared))


def copy_prefix(store: EventStore, run_name: str, fork: Session, parent_turns: Sequence[Turn]) -> int:
    """Copy the parent's turns ``0..K-1`` into fork ``fork`` at once (a fork started from a sandbox
    checkpoint, whose agent sends none of those requests again); id for id as a replayed copy, its
    request fingerprint the parent's. Turns the fork holds already are skipped (a re-run copies on).
    Returns how many turns the fork holds before its fork turn."""
    state = build_fork_replay(fork, store.turns.read(session_id=fork.id, with_experts=False), parent_turns)
    if state is None:
        return fork.fork_turn or 0
    held = len(store.turns.read(session_id=fork.id, with_experts=False))
    for turn in state.parent_turns[held:]:
        store.turns.append(run_name, state.copy(turn, run_name, fork.id, turn.request_fingerprint))
    return state.fork_turn
