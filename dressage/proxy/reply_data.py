"""What a recorded turn's reply is rebuilt from: :class:`ReplyData`.

Its own module so that the session state (:mod:`dressage.proxy.sessions`), the replay of a taken-over
session (:mod:`dressage.proxy.replay`) and the dialects share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dressage.tito.tool_calls import ParsedAssistant


@dataclass
class ReplyData:
    """What a recorded turn's reply is rebuilt from (a retry answers with it)."""

    turn_index: int
    turn_id: str
    generated_ids: list[int]
    logprobs: list[float]
    stop_reason: str
    matched_stop: str | None
    prompt_tokens: int
    created: int
    rid: str = ""
    forced_ids: list[int] = field(default_factory=list)
    """Ids the proxy forced at the start of the turn (a tool-call opening); part of the reply text."""
    parsed: ParsedAssistant | None = field(default=None, compare=False, repr=False)
    """The parse of the reply for the request that produced it (a cache; None when rebuilt)."""
    parsed_for: str | None = field(default=None, compare=False, repr=False)
    """The fingerprint of the request ``parsed`` belongs to."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per generated token, the engine's best ``(token_id, logprob)`` alternatives (when asked)."""
    choice_index: int = 0
    """Which choice of an ``n > 1`` request this turn is."""
    siblings: list[ReplyData] = field(default_factory=list, compare=False, repr=False)
    """Choice 0 of an ``n > 1`` request: the replies of choices 1..n-1, in order."""

    @property
    def choices(self) -> list[ReplyData]:
        """Every choice of the request this reply answers (itself first)."""
        return [self, *self.siblings]
