"""A session started from a sandbox checkpoint: its first live request must be the recorded one.

A fork or a take-over that starts from the checkpoint of turn K (:mod:`dressage.rollout.checkpointing`)
restores the sandbox as it was when request K reached the proxy and starts its agent from the
conversation of that request (``Agent.resume``). Its session's ``info["start"]`` names K,
the checkpoint it came from and the digest of the prompt ids request K rendered to. The proxy checks
the session's first live request at K against that digest, token for token:

* equal: the request goes on live (a fork's turns ``0..K-1``, copied from its parent when it was
  opened, and this turn form one segment, as they would have without the checkpoint);
* not equal (the agent did not rebuild its conversation exactly): a ``checkpoint_diverged`` event
  records both digests. A fork (``on_diverge: refuse``) has the request refused with 409
  ``checkpoint_diverged`` and nothing recorded for it; its worker falls back to replay (a new
  attempt takes the branch over and replays turns ``0..K-1`` from the log, re-running the agent's
  tools) and records why. A take-over (``on_diverge: record``) goes on live, as a resumed session
  whose replay diverged does (:mod:`dressage.proxy.replay`: the live turn opens its own segment).

The expectation is rebuilt from the log like the rest of
:class:`~dressage.proxy.sessions.SessionState`: it holds while no turn at or past K is recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dressage.errors import ConflictError
from dressage.store import Session, Turn, deterministic_key

if TYPE_CHECKING:
    from dressage.proxy.sessions import SessionState
    from dressage.store import EventStore

CHECKPOINT_START = "start"
"""``info`` key of how a fork or take-over started: ``path`` (``checkpoint``: ``turn``, ``prompt_digest``,
``from``; ``replay``: ``why``)."""

CHECKPOINT_DIVERGED = "checkpoint_diverged"
"""Error code and event kind of a first request that is not the checkpoint's recorded one."""


@dataclass
class CheckpointStart:
    """What a session started from the checkpoint of turn ``turn_index`` must send first."""

    turn_index: int
    prompt_digest: str
    source: str
    """Where the checkpoint came from (``session S turn K``), for the error."""
    refuse: bool = True
    """Refuse a diverging request (a fork) or only record it (a take-over)."""
    checked: bool = False

    def pending(self, turn_index: int) -> bool:
        """Whether request ``turn_index`` is the first live one, still to check."""
        return not self.checked and turn_index == self.turn_index

    async def check(self, store: EventStore, state: SessionState, turn_index: int, digest: str) -> None:
        """Accept the request whose prompt ids have sha256 ``digest``, or record why not and refuse it."""
        self.checked = True
        if digest == self.prompt_digest:
            return
        error = (
            f"checkpoint diverged at turn {turn_index}: the resumed agent's request does not render to the "
            f"prompt recorded with the checkpoint of {self.source}; nothing was recorded"
        )
        payload = {
            "turn_index": turn_index,
            "expected_digest": self.prompt_digest,
            "got_digest": digest,
            "error": error,
        }
        key = deterministic_key(state.run_name, state.session_id, CHECKPOINT_DIVERGED, turn_index, digest)
        await asyncio.to_thread(
            store.events.append,
            state.run_name,
            CHECKPOINT_DIVERGED,
            payload,
            key=key,
            session_id=state.session_id,
        )
        if self.refuse:
            self.checked = False  # the fallback's own attempt is checked by nobody: it replays
            raise ConflictError(error, code=CHECKPOINT_DIVERGED)


def build_checkpoint_start(session: Session, turns: Sequence[Turn]) -> CheckpointStart | None:
    """The expectation of a session started from a checkpoint, while its first live turn is not recorded."""
    raw = session.info.get(CHECKPOINT_START) if isinstance(session.info, dict) else None
    if not isinstance(raw, dict) or raw.get("path") != "checkpoint":
        return None
    k = int(raw["turn"])
    if any(t.turn_index >= k for t in turns):
        return None
    refuse = raw.get("on_diverge", "refuse") == "refuse"
    return CheckpointStart(k, str(raw["prompt_digest"]), str(raw.get("from", "")), refuse)
