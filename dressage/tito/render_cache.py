"""Incremental rendering: re-render only the messages a request adds to one seen before.

An agent re-sends its whole conversation every turn; rendering it from scratch (normalising
every message, writing every turn, NFC over the whole text) made the per-turn cost grow with the
history. :class:`IncrementalRenderer` keeps, per session, the last few renderings as per-message
pieces (already NFC-normalised). A request whose messages share a prefix with a cached rendering
(compared with ``==``, a C-speed walk over the parsed JSON) reuses those pieces and renders only:

* the messages after the shared prefix;
* the last shared message (a tool result's piece depends on whether a tool result follows it);
* the assistant turns between the cached and the new last user query (the template writes their
  ``<think>`` block only after the last query: a new user turn changes them);
* shared messages whose rendering ``==`` cannot vouch for: tool-call arguments given as objects
  (key order and ``1``/``1.0``/``True`` are equal for ``==`` but render differently) and content
  parts whose text is not a string, unless their ``repr`` (which tells key order, ``1`` from
  ``1.0`` from ``True``) is the one cached: Anthropic Messages sends every tool call's input as
  an object, and re-rendering all of them made each turn's cost grow with the history.

The header (tools, system prompt) and the generation prompt are always rendered afresh (they do
not grow with the history). NFC is applied per piece: every piece starts with ``<`` or ``\\n``,
which no character composes with, so the pieces' NFC concatenate to the NFC of the whole text
(checked at run time; otherwise the whole text is normalised). The result is byte-identical to
rendering the whole conversation (tests/tito check it against the full renderer).
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dressage.errors import TemplateError
from dressage.tito.chat_template import (
    QWEN35,
    QwenFlavor,
    _plain,
    generation_prompt,
    normalize_messages,
    render_content,
    render_header,
    render_message,
)

MAX_ENTRIES = 4
"""Renderings kept per session: enough for a main agent and interleaved subagents or branches."""


def nfc(text: str) -> str:
    """NFC, the normalisation the tokenizer applies (a no-op for ASCII, checked in C)."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


@dataclass(frozen=True)
class PromptText:
    """A rendered prompt, NFC-normalised: the text and the length of its header (system turn)."""

    text: str
    header_len: int


def _is_query(msg: Mapping[str, object]) -> bool:
    """Whether a normalised message is a real user query (not only a ``<tool_response>`` wrapper)."""
    if msg.get("role") != "user":
        return False
    text = render_content(msg.get("content")).strip()
    return not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))


def _trusted(raw: object) -> bool:
    """Whether ``==`` on this raw message implies an equal rendering (see the module docstring)."""
    if type(raw) is not dict:
        return False
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            return False
        for part in content:
            if type(part) is not dict or not isinstance(part.get("text", ""), str):
                return False
    calls = raw.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            return False
        for call in calls:
            fn = call.get("function", call) if type(call) is dict else None
            if type(fn) is not dict or not isinstance(fn.get("arguments", ""), str):
                return False
    return True


def common_prefix_len(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the common prefix of two strings or lists (C-speed slice compares, then bisection)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Entry:
    """One cached rendering: raw message copies, normalised messages and their NFC pieces."""

    raw: list[object]
    norm: list[dict[str, object]]
    pieces: list[str]
    queries: list[int]  # indices of real user queries, ascending
    untrusted: list[int]  # indices whose equality does not imply an equal rendering
    strict: dict[int, str]  # their repr when rendered: the same repr renders the same
    separable: bool  # every piece starts with "<" or "\n": per-piece NFC equals whole-text NFC


class IncrementalRenderer:
    """Per-session Qwen3.5/3.6 renderer that reuses the pieces of earlier renderings."""

    def __init__(
        self, default_thinking: bool = True, max_entries: int = MAX_ENTRIES, flavor: QwenFlavor = QWEN35
    ) -> None:
        """``default_thinking``: True for the think template (used when ``enable_thinking`` is None)."""
        self.default_thinking = default_thinking
        self.flavor = flavor
        self.max_entries = max_entries
        self._entries: list[_Entry] = []
        self.reused = 0
        """Pieces reused by the last :meth:`render` (for tests and profiling)."""

    def _lookup(self, messages: list[object]) -> tuple[_Entry | None, int]:
        best: tuple[_Entry | None, int] = (None, 0)
        for entry in self._entries:
            try:
                k = common_prefix_len(messages, entry.raw)
            except (TypeError, ValueError):  # values whose == is not a bool (arrays): no reuse
                continue
            if k > best[1]:
                best = (entry, k)
        return best

    def render(
        self,
        messages: Sequence[object],
        tools: Sequence[object] | None = None,
        enable_thinking: bool | None = None,
    ) -> PromptText:
        """Render with the generation prompt; equal to NFC of the full template rendering."""
        msgs = messages if isinstance(messages, list) else list(messages)
        if not msgs:
            raise TemplateError("No messages provided.")
        entry, k = self._lookup(msgs)
        if entry is None:
            k = 0
        new_norm = normalize_messages(msgs[k:])
        norm = [*entry.norm[:k], *new_norm] if entry is not None else new_norm
        queries = entry.queries[: bisect.bisect_left(entry.queries, k)] if entry is not None else []
        queries += [k + j for j, m in enumerate(new_norm) if _is_query(m)]
        if not queries:
            raise TemplateError("No user query found in messages.")
        last = queries[-1]
        redo = set(range(max(k - 1, 0), len(norm)))
        strict: dict[int, str] = {}  # repr of the shared untrusted messages
        if entry is not None:
            old_last = entry.queries[-1]
            if old_last != last:
                lo, hi = sorted((old_last, last))
                redo.update(range(lo + 1, min(hi + 1, k)))
            for i in entry.untrusted:
                if i >= k:
                    continue
                strict[i] = repr(msgs[i])
                if strict[i] != entry.strict.get(i):
                    norm[i] = normalize_messages([msgs[i]])[0]
                    redo.add(i)
        pieces = entry.pieces[:k] if entry is not None else []
        pieces.extend([""] * (len(norm) - len(pieces)))
        for i in sorted(redo):
            pieces[i] = nfc(render_message(norm, i, last, self.flavor))
        header = render_header(norm, _plain(tools) if tools is not None else None)
        thinking = self.default_thinking if enable_thinking is None else enable_thinking
        suffix = generation_prompt(thinking)
        self.reused = len(norm) - len(redo)
        # Cached pieces were checked when rendered: check only the new ones.
        separable = all(not pieces[i] or pieces[i][0] in "<\n" for i in redo)
        separable &= entry is None or entry.separable
        self._store(entry, k, msgs, norm, pieces, queries, separable, strict)
        head = nfc(header)
        if separable:
            return PromptText(head + "".join(pieces) + suffix, len(head))
        full = header + "".join(pieces) + suffix  # not reached with this template; kept exact
        return PromptText(unicodedata.normalize("NFC", full), len(head))

    def _store(
        self,
        entry: _Entry | None,
        k: int,
        msgs: list[object],
        norm: list[dict[str, object]],
        pieces: list[str],
        queries: list[int],
        separable: bool,
        strict: dict[int, str],
    ) -> None:
        """Cache this rendering (own copies of the new raw messages: callers may mutate theirs)."""
        new_raw = [_plain(m) for m in msgs[k:]]
        raw = [*entry.raw[:k], *new_raw] if entry is not None else new_raw
        untrusted = [i for i in entry.untrusted if i < k] if entry is not None else []
        untrusted += [k + j for j, m in enumerate(msgs[k:]) if not _trusted(m)]
        strict.update((i, repr(msgs[i])) for i in untrusted if i >= k)  # what each was rendered from
        if entry is not None and k == len(entry.raw):
            self._entries.remove(entry)  # a prefix of the new entry: dominated
        self._entries.insert(0, _Entry(raw, norm, pieces, queries, untrusted, strict, separable))
        del self._entries[self.max_entries :]
