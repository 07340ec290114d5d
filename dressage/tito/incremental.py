"""Incremental tokenization (TITO): extend exact token ids turn by turn, never re-encoding history.

A *segment* is one token-contiguous sequence: the prompt ids and the engine's generated ids of
each of its turns, plus the text those ids decode to. For a new request the conversation is
rendered (NFC, as the tokenizer normalises); the longest segment *anchor* (end of a turn's prompt
or of its generation) whose text is a prefix of the rendering is extended: only the new suffix is
encoded and appended to the exact prior ids. The split must touch a special token (``<|im_end|>``
ends every generation; special tokens are split off before BPE) so suffix ids equal those of a
from-scratch encode.

Routes: ``append`` (extends the end of a segment's latest turn), ``branch`` (extends an earlier
anchor: retry/regeneration; forks a new segment), ``create`` (nothing matched: new segment from a
full encode). Boundary reason codes (``create`` only; ``None`` when the session had no segment):

- ``think_stripped``: the template dropped a previous turn's reasoning (Qwen3.5 drops the
  ``<think>`` block at every new user query; see :meth:`ModelProfile.reasoning_dropped`).
- ``tools_changed``: the tools list differs from the closest segment's.
- ``new_context``: the system turn differs (subagent, another task, a new system prompt).
- ``new_conversation``: the system turn (and tools) are the same but the first message after it
  differs: a subagent sharing the main agent's system prompt, or a compaction that rewrote the
  whole history. The request shares no earlier turn's prompt, so it is never a ``branch``.
- ``template_prefix_mismatch``: any other divergence (compaction, edited history, JSON arguments
  re-serialised differently, model output not in template form).
- ``unsafe_split``: the text matched but no matching anchor touches a special token.
- ``tokenization_failed``: the suffix could not be encoded alone; the whole prompt was encoded.

Per-turn cost: the session's :class:`~dressage.tito.profiles.PromptRenderer` re-renders only the
messages a request adds (Qwen3.5: :mod:`dressage.tito.render_cache`), only the suffix is encoded,
and :attr:`TitoPlan.prompt` is a view of the prior ids (no copy); what remains proportional to
the history runs in C (message equality, prefix compare, string joins).

State is rebuilt from :class:`IndexedTurn` s (ids only; texts are re-derived by decoding).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dressage.errors import TokenizationError
from dressage.tito.model_profile import ModelProfile
from dressage.tito.render_cache import common_prefix_len

Route = Literal["append", "branch", "create"]
REASON_THINK_STRIPPED = "think_stripped"
REASON_TOOLS_CHANGED = "tools_changed"
REASON_NEW_CONTEXT = "new_context"
REASON_NEW_CONVERSATION = "new_conversation"
REASON_PREFIX_MISMATCH = "template_prefix_mismatch"
REASON_UNSAFE_SPLIT = "unsafe_split"
REASON_TOKENIZATION_FAILED = "tokenization_failed"


def tools_key(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """Stable short hash of a tools list (empty string when there are none)."""
    if not tools:
        return ""
    return hashlib.sha256(json.dumps(tools, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Anchor:
    """A point of a segment where a request may attach: after a turn's prompt or its generation."""

    text_len: int
    ids_len: int
    turn_index: int
    kind: Literal["prompt", "end"]


@dataclass
class Segment:
    """Exact ids and their text, with per-turn anchors; grows by appending only."""

    segment_id: str
    tools_key: str
    header_len: int
    ids: list[int] = field(default_factory=list)
    text: str = ""
    turn_ids: list[str] = field(default_factory=list)
    anchors: list[Anchor] = field(default_factory=list)

    def fork(self, segment_id: str, anchor: Anchor) -> Segment:
        """A new segment holding this one's ids/text/turns up to ``anchor``."""
        keep = [
            a for a in self.anchors if a.text_len <= anchor.text_len and a.turn_index <= anchor.turn_index
        ]
        if anchor.kind == "prompt":  # the turn itself is re-done: drop its prompt anchor too
            keep = [a for a in keep if a.turn_index < anchor.turn_index]
        turns = self.turn_ids[: anchor.turn_index + (1 if anchor.kind == "end" else 0)]
        return Segment(
            segment_id,
            self.tools_key,
            self.header_len,
            self.ids[: anchor.ids_len],
            self.text[: anchor.text_len],
            list(turns),
            keep,
        )


class PromptIds(Sequence[int]):
    """A plan's prompt ids without copying them: ``prefix[:prefix_len]`` followed by ``delta``.

    Segments only grow, so the view stays valid after more turns land on the segment. Iterating
    (``list(view)``, ``[*view, *more]``) runs at C speed.
    """

    __slots__ = ("_delta", "_n", "_prefix")

    def __init__(self, prefix: Sequence[int], prefix_len: int, delta: Sequence[int]) -> None:
        """View ``prefix[:prefix_len] + delta``."""
        self._prefix, self._n, self._delta = prefix, prefix_len, delta

    @property
    def prefix(self) -> Sequence[int]:
        """The (growing) list the view's first ids come from."""
        return self._prefix

    @property
    def prefix_len(self) -> int:
        """How many of :attr:`prefix`'s ids the view starts with."""
        return self._n

    @property
    def delta(self) -> Sequence[int]:
        """The ids after the prefix."""
        return self._delta

    def __len__(self) -> int:
        return self._n + len(self._delta)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(itertools.islice(self._prefix, self._n), self._delta)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("prompt id index out of range")
        return self._prefix[i] if i < self._n else self._delta[i - self._n]

    def tolist(self) -> list[int]:
        """The ids as a new list."""
        return [*self._prefix[: self._n], *self._delta]


@dataclass(frozen=True)
class TitoPlan:
    """How to build the prompt ids of one request (pure; :meth:`SegmentIndex.record` commits it)."""

    route: Route
    segment_id: str
    parent_segment_id: str | None
    parent_turn_id: str | None
    fork_at: Literal["prompt", "end"] | None
    delta_ids: tuple[int, ...]
    prefix_ids: Sequence[int]
    prefix_len: int
    prompt_text: str
    tools_key: str
    header_len: int
    boundary_reason: str | None

    @property
    def prompt_ids(self) -> list[int]:
        """The full prompt ids as a new list (O(prompt); the hot path uses :attr:`prompt`)."""
        return [*self.prefix_ids[: self.prefix_len], *self.delta_ids]

    @property
    def prompt(self) -> PromptIds:
        """The full prompt ids as a view: exact prior ids followed by the context delta."""
        return PromptIds(self.prefix_ids, self.prefix_len, self.delta_ids)

    @property
    def prompt_len(self) -> int:
        """Number of prompt ids."""
        return self.prefix_len + len(self.delta_ids)


@dataclass(frozen=True)
class IndexedTurn:
    """What the log keeps per turn so a restarted proxy can rebuild its :class:`SegmentIndex`."""

    turn_id: str
    segment_id: str
    route: Route
    parent_segment_id: str | None
    parent_turn_id: str | None
    fork_at: Literal["prompt", "end"] | None
    delta_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    tools_key: str
    header_len: int
    boundary_reason: str | None


class SegmentIndex:
    """Per-session segments; routes requests (:meth:`plan`) and records turns (:meth:`record`)."""

    def __init__(self, profile: ModelProfile) -> None:
        """An empty index for a session served by ``profile``."""
        self.profile = profile
        self.tokenizer = profile.tokenizer
        self.segments: dict[str, Segment] = {}
        self._renderer = profile.prompt_renderer()
        self._turns: dict[str, tuple[str, int]] = {}
        specials = sorted(self.tokenizer.hf.get_added_tokens_decoder().items())
        self._special_ids = {i for i, _ in specials}
        self._special_texts = tuple(t.content for _, t in specials)
        self._special_re = re.compile("|".join(re.escape(t) for t in self._special_texts))

    # --- routing ----------------------------------------------------------------------------

    def _safe_split(self, segment: Segment, anchor: Anchor, text: str) -> bool:
        """True when splitting ``text`` at ``anchor`` touches a special token (or adds nothing)."""
        if anchor.text_len == len(text) or anchor.ids_len == 0:
            return True
        if segment.ids[anchor.ids_len - 1] in self._special_ids and segment.text.endswith(
            self._special_texts, 0, anchor.text_len
        ):
            return True
        return self._special_re.match(text, anchor.text_len) is not None

    def _best_anchor(self, segment: Segment, text: str) -> tuple[Anchor | None, bool]:
        """Largest safe anchor of ``segment`` whose text prefixes ``text``; flag if an unsafe one matched."""
        anchors = segment.anchors
        if text.startswith(segment.text):
            k = len(anchors) - 1
        else:
            lo, hi = 0, len(anchors) - 1
            k = -1
            while lo <= hi:
                mid = (lo + hi) // 2
                if text.startswith(segment.text[: anchors[mid].text_len]):
                    k, lo = mid, mid + 1
                else:
                    hi = mid - 1
        unsafe = False
        while k >= 0:
            if self._safe_split(segment, anchors[k], text):
                return anchors[k], unsafe
            unsafe = True
            k -= 1
        return None, unsafe

    def _reason(self, text: str, tkey: str, header_len: int, any_unsafe: bool) -> str | None:
        """Boundary reason for a ``create`` (see module docstring)."""
        if not self.segments:
            return None
        if any_unsafe:
            return REASON_UNSAFE_SPLIT
        best = max(self.segments.values(), key=lambda ln: common_prefix_len(ln.text, text))
        if best.tools_key != tkey:
            return REASON_TOOLS_CHANGED
        cpl = common_prefix_len(best.text, text)
        if cpl < min(best.header_len, header_len):
            return REASON_NEW_CONTEXT
        first_end = self.profile.first_turn_end(best.text, best.header_len)
        if first_end < 0 or cpl < first_end:
            return REASON_NEW_CONVERSATION
        if self.profile.reasoning_dropped(best.text, text, cpl):
            return REASON_THINK_STRIPPED
        return REASON_PREFIX_MISMATCH

    def plan(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> TitoPlan:
        """Route a request and compute its prompt ids (does not change the index, only the render cache)."""
        rendered = self._renderer.render(messages, tools, enable_thinking)
        text, header_len = rendered.text, rendered.header_len
        tkey = tools_key(tools)
        best: tuple[Segment, Anchor] | None = None
        any_unsafe = False
        for segment in self.segments.values():
            anchor, unsafe = self._best_anchor(segment, text)
            any_unsafe |= unsafe and anchor is None
            if anchor is not None and (best is None or anchor.text_len >= best[1].text_len):
                best = (segment, anchor)
        reason: str | None = None
        if best is not None:
            segment, anchor = best
            try:
                delta = tuple(self.tokenizer.encode(text[anchor.text_len :]))
            except TokenizationError:
                best, reason = None, REASON_TOKENIZATION_FAILED
            else:
                is_tip = anchor is segment.anchors[-1] and anchor.kind == "end"
                return TitoPlan(
                    route="append" if is_tip else "branch",
                    segment_id=segment.segment_id if is_tip else uuid.uuid4().hex[:16],
                    parent_segment_id=segment.segment_id,
                    parent_turn_id=segment.turn_ids[anchor.turn_index],
                    fork_at=anchor.kind,
                    delta_ids=delta,
                    prefix_ids=segment.ids,
                    prefix_len=anchor.ids_len,
                    prompt_text=text,
                    tools_key=tkey,
                    header_len=header_len,
                    boundary_reason=None,
                )
        if reason is None:
            reason = self._reason(text, tkey, header_len, any_unsafe)
        return TitoPlan(
            route="create",
            segment_id=uuid.uuid4().hex[:16],
            parent_segment_id=None,
            parent_turn_id=None,
            fork_at=None,
            delta_ids=tuple(self.tokenizer.encode(text)),
            prefix_ids=(),
            prefix_len=0,
            prompt_text=text,
            tools_key=tkey,
            header_len=header_len,
            boundary_reason=reason,
        )

    # --- recording --------------------------------------------------------------------------

    def record(self, plan: TitoPlan, turn_id: str, generated_ids: Sequence[int]) -> IndexedTurn:
        """Commit a planned turn with the engine's generated ids (kept exactly as given)."""
        rec, delta_text = self.resolve(plan, turn_id, generated_ids)
        self.apply(rec, delta_text=delta_text)
        return rec

    def resolve(self, plan: TitoPlan, turn_id: str, generated_ids: Sequence[int]) -> tuple[IndexedTurn, str]:
        """The record a planned turn would commit, and its prompt delta's text (changes nothing).

        :meth:`apply` of both commits it: a caller that must first make the turn durable resolves,
        appends, then applies, so a failed append leaves the index as it was.
        """
        rec = IndexedTurn(
            turn_id=turn_id,
            segment_id=plan.segment_id,
            route=plan.route,
            parent_segment_id=plan.parent_segment_id,
            parent_turn_id=plan.parent_turn_id,
            fork_at=plan.fork_at,
            delta_ids=plan.delta_ids,
            generated_ids=tuple(generated_ids),
            tools_key=plan.tools_key,
            header_len=plan.header_len,
            boundary_reason=plan.boundary_reason,
        )
        tip = self.segments.get(plan.segment_id)
        if plan.route == "append" and tip is not None and tip.turn_ids[-1] != plan.parent_turn_id:
            # Another turn landed on this segment since planning: this one becomes a branch.
            rec = IndexedTurn(**{**rec.__dict__, "route": "branch", "segment_id": uuid.uuid4().hex[:16]})
        start = self._anchor_of(rec)[1].text_len if rec.route != "create" else 0
        return rec, plan.prompt_text[start:]

    def _anchor_of(self, rec: IndexedTurn) -> tuple[Segment, Anchor]:
        """The segment and anchor a non-create record attaches to."""
        if rec.parent_turn_id not in self._turns:
            raise TokenizationError(f"turn {rec.turn_id} extends unknown turn {rec.parent_turn_id}")
        segment_id, turn_index = self._turns[rec.parent_turn_id]
        segment = self.segments[segment_id]
        # Each turn adds its prompt then its end anchor (forks keep whole turns): try that slot first.
        slot = 2 * turn_index + (rec.fork_at == "end")
        if slot < len(segment.anchors):
            a = segment.anchors[slot]
            if a.turn_index == turn_index and a.kind == rec.fork_at:
                return segment, a
        for a in segment.anchors:
            if a.turn_index == turn_index and a.kind == rec.fork_at:
                return segment, a
        raise TokenizationError(
            f"turn {rec.parent_turn_id} has no {rec.fork_at} anchor in segment {segment_id}"
        )

    def apply(self, rec: IndexedTurn, delta_text: str | None = None) -> None:
        """Apply one turn record (live or replayed); ``delta_text`` defaults to decoding the ids."""
        if delta_text is None:
            delta_text = self.tokenizer.decode(list(rec.delta_ids))
        if rec.route == "create":
            segment = Segment(rec.segment_id, rec.tools_key, rec.header_len)
            self.segments[rec.segment_id] = segment
        else:
            parent, anchor = self._anchor_of(rec)
            if rec.route == "append":
                segment = parent
            else:
                segment = parent.fork(rec.segment_id, anchor)
                self.segments[rec.segment_id] = segment
        turn_index = len(segment.turn_ids)
        segment.turn_ids.append(rec.turn_id)
        segment.ids.extend(rec.delta_ids)
        segment.text += delta_text
        segment.anchors.append(Anchor(len(segment.text), len(segment.ids), turn_index, "prompt"))
        segment.ids.extend(rec.generated_ids)
        segment.text += self.tokenizer.decode(list(rec.generated_ids))
        segment.anchors.append(Anchor(len(segment.text), len(segment.ids), turn_index, "end"))
        self._turns[rec.turn_id] = (segment.segment_id, turn_index)

    @classmethod
    def rebuild(cls, profile: ModelProfile, records: Iterable[IndexedTurn]) -> SegmentIndex:
        """Reconstruct an index from recorded turns, in the order they were recorded."""
        index = cls(profile)
        for rec in records:
            index.apply(rec)
        return index
