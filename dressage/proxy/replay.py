"""Replay of a resumed session: requests that match recorded turns are answered from the log.

A session that a new attempt took over (see :mod:`dressage.store.sessions`) holds the turns the dead
attempt recorded. The new attempt's agent starts again in a fresh sandbox and sends, one by one,
the requests the first agent sent; each one that matches a recorded turn (its *replay target*) is
answered with that turn's recorded reply (token ids, logprobs, stop reason, tool calls parsed as
before): no engine call, no new turn row. So the agent re-executes its own tool calls and rebuilds
its sandbox state. The first request that matches no target ends the replay; from it on the
session is live:

* it extends the tip of a recorded lineage (the agent asks for the turn after the last recorded
  one): the replay *completed*, the turn appends to the segment as it would have without the crash;
* otherwise the agent (or a tool) behaved differently: the replay *diverged*; the live turn opens
  its segment (a branch from the longest recorded prefix it shares, or a new one) under boundary
  reason ``replay_diverged``. A new lineage opened so (the agent's first request already differed,
  say a prompt with a timestamp) takes the root thread over, as a compaction does
  (:mod:`dressage.training.materialize`): the trajectory's anchor is the live run, never the dead
  attempt's turns.

A request matches a target when its body is byte-identical to the target's (the fingerprint), or
when it renders (TITO) to exactly the target's prompt ids, forced tool-call ids included, and asks
for as many choices. Targets are matched in turn order, each at most once; a request identical to
one already replayed (an HTTP retry) gets the same reply again. The first live turn records
``info["replay"]`` (outcome and counters), and the proxy adds the counters to the session's info
when the session is finalized.

Replay is rebuilt from the log like the rest of :class:`~dressage.proxy.sessions.SessionState`: it
is active while no turn has been recorded past the takeover (``info["resume"]["next_turn"]``), so
a proxy restart mid-replay replays again, and one after the replay ended does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dressage.store import Session, Turn
from dressage.tito.render_cache import common_prefix_len

if TYPE_CHECKING:
    from dressage.proxy.conversation import Conversation
    from dressage.proxy.reply_data import ReplyData
    from dressage.tito import SegmentIndex

DIFF_CONTEXT = 12
"""Tokens shown on each side of the first difference between a recorded prompt and a request's."""

REASON_REPLAY_DIVERGED = "replay_diverged"
"""Boundary reason of the first live segment of a resumed session whose agent did not replay."""


def ids_digest(ids: Iterable[int]) -> str:
    """sha256 of a token-id sequence (little-endian int64), the prompt identity replay compares."""
    return hashlib.sha256(np.fromiter(ids, dtype="<i8").tobytes()).hexdigest()


@dataclass
class ReplayTarget:
    """One recorded turn (choice 0, not abandoned) a request of the resumed agent may match."""

    turn_index: int
    fingerprint: str | None
    prompt_digest: str
    consumed: bool = False


@dataclass
class Replay:
    """The replay state of one resumed session (see the module docstring)."""

    targets: list[ReplayTarget]
    next_turn: int
    """Turns recorded when the session was taken over."""
    active: bool = True
    ending: bool = False
    """A request matched no target: the next live turn records the outcome."""
    outcome: str | None = None
    turns: int = 0
    tokens: int = 0
    live_turn: int | None = None
    by_fingerprint: dict[str, int] = field(default_factory=dict)
    """Fingerprints of replayed requests -> the turn that answered them (retries answer again)."""

    def match(
        self, index: SegmentIndex, replies: Mapping[int, ReplyData], conv: Conversation
    ) -> ReplyData | None:
        """The recorded reply for ``conv`` if it matches a target (``replies``: the session's
        recorded replies by turn index, ``index`` its segment index); else end the replay (None)."""
        if not self.active:
            return None
        done = self.by_fingerprint.get(conv.fingerprint)
        if done is not None:
            return replies.get(done)
        open_targets = [x for x in self.targets if not x.consumed]
        hit = next((x for x in open_targets if x.fingerprint == conv.fingerprint), None)
        if hit is None and open_targets:
            digest = ids_digest(request_prompt(index, conv))
            hit = next((x for x in open_targets if x.prompt_digest == digest), None)
        reply = replies.get(hit.turn_index) if hit is not None else None
        if hit is None or reply is None or len(reply.choices) != conv.n:
            self.active, self.ending = False, True
            return None
        hit.consumed = True
        self.by_fingerprint[conv.fingerprint] = hit.turn_index
        self.turns += len(reply.choices)
        self.tokens += sum(len(c.generated_ids) for c in reply.choices)
        return reply

    def end(self, route: str, turn_index: int) -> str:
        """Settle the outcome with the first live turn's route; returns it."""
        self.ending = False
        self.outcome = "completed" if route == "append" else "diverged"
        self.live_turn = turn_index
        return self.outcome

    def summary(self) -> dict[str, object]:
        """Counters for the turn's and the session's info."""
        return {
            "outcome": self.outcome,
            "turns_replayed": self.turns,
            "tokens_replayed": self.tokens,
            "targets": len(self.targets),
            "from_turn": self.next_turn,
            "live_turn": self.live_turn,
        }


def request_prompt(index: SegmentIndex, conv: Conversation) -> list[int]:
    """The prompt ids ``conv`` renders to in this session, forced tool-call ids included."""
    plan = index.plan(conv.messages, conv.tools, conv.enable_thinking)
    ids = plan.prompt.tolist()
    if conv.force_tool is not None:
        profile = index.profile
        ids += profile.tokenizer.encode(
            profile.forced_tool_call_prefix(conv.force_tool, conv.enable_thinking)
        )
    return ids


def recorded_prompt(turns: Sequence[Turn], turn_index: int) -> list[int]:
    """The whole prompt turn ``turn_index`` of ``turns`` was generated from: its segment's tokens
    before it (context and generated ids of the earlier turns of that segment) and its context ids."""
    by_index = {t.turn_index: t for t in turns}
    target = by_index[turn_index]
    ids: list[int] = []
    for turn in sorted(turns, key=lambda x: x.turn_index):
        if turn.turn_index > turn_index:
            break
        if turn.segment_index != target.segment_index:
            continue
        ids += [int(x) for x in turn.context_ids]
        if turn.turn_index < turn_index:
            ids += [int(x) for x in turn.generated_ids]
    return ids


def prompt_difference(
    recorded: Sequence[int], request: Sequence[int], decode: Callable[[list[int]], str]
) -> str:
    """Where ``request``'s prompt ids first differ from ``recorded``'s, in words with the text around
    it on both sides (``decode``: ids to text), e.g. ``at prompt token 812 of 900: recorded '... 0.03s'
    ... request '... 0.02s'``; what a divergence records, so its cause can be read."""
    recorded, request = list(recorded), list(request)
    if recorded == request:
        return "the prompt ids are equal"
    same = common_prefix_len(recorded, request)
    window = slice(max(0, same - DIFF_CONTEXT), same + DIFF_CONTEXT)
    return (
        f"at prompt token {same} (recorded {len(recorded)} tokens, request {len(request)}): recorded "
        f"{decode(list(recorded[window]))!r}, request {decode(list(request[window]))!r}"
    )


def build_replay(session: Session, turns: Sequence[Turn]) -> Replay | None:
    """The replay of a resumed session rebuilt from its turns; None when there is nothing to replay.

    Nothing to replay: the session was never resumed, recorded no turn before the takeover, or has
    recorded a turn since (its replay ended).
    """
    resume = session.info.get("resume") if isinstance(session.info, dict) else None
    if not isinstance(resume, dict):
        return None
    next_turn = int(resume.get("next_turn", 0))
    if next_turn <= 0 or any(x.turn_index >= next_turn for x in turns):
        return None
    targets = replay_targets(turns)
    return Replay(targets=targets, next_turn=next_turn) if targets else None


def replay_targets(turns: Sequence[Turn]) -> list[ReplayTarget]:
    """The turns a replaying agent's requests may match (choice 0, not abandoned), in turn order,
    each with its body fingerprint and the digest of its whole prompt (its segment's tokens so far)."""
    hashes: dict[int, hashlib._Hash] = {}  # segment -> running sha256 of its tokens
    targets: list[ReplayTarget] = []
    for turn in sorted(turns, key=lambda x: x.turn_index):
        seg = hashes.setdefault(turn.segment_index, hashlib.sha256())
        seg.update(np.asarray(turn.context_ids, dtype="<i8").tobytes())
        tito = turn.info.get("tito") or {}
        choice = turn.info.get("choice") or {}
        if not tito.get("aborted") and not int(choice.get("index", 0)):
            targets.append(ReplayTarget(turn.turn_index, turn.request_fingerprint, seg.hexdigest()))
        seg.update(np.asarray(turn.generated_ids, dtype="<i8").tobytes())
    return targets
