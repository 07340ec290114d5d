"""The JSON of a ``/generate`` body's ``input_ids``, encoded once per id, not once per turn.

A session's prompt grows by a few hundred ids a turn on top of tens of thousands already sent;
encoding the whole list every turn made the body's cost grow with the conversation. A prompt that
is a view on a growing segment (:class:`~dressage.tito.incremental.PromptIds`: ``prefix[:n] +
delta``) reuses the JSON text of ``prefix[:n]`` encoded on earlier turns and encodes only what was
added since, plus the delta. Anything else (a plain list) is encoded whole.

The cache holds the text of at most ``capacity`` segments (least recently used dropped): about
six bytes per id, so 256 segments of 30k ids are ~45 MB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import orjson


@runtime_checkable
class PrefixView(Protocol):
    """A prompt made of a growing prefix list's first ``prefix_len`` ids and a delta."""

    @property
    def prefix(self) -> Sequence[int]: ...

    @property
    def prefix_len(self) -> int: ...

    @property
    def delta(self) -> Sequence[int]: ...


def _encode(ids: Sequence[int]) -> bytes:
    """``1,2,3`` (no brackets)."""
    return orjson.dumps(ids if type(ids) is list else list(ids))[1:-1]


class _Entry:
    """One prefix list's encoded text and, for each length it was cut at, the text's length."""

    __slots__ = ("cuts", "prefix", "text")

    def __init__(self, prefix: Sequence[int]) -> None:
        self.prefix = prefix  # held, so its id() is not reused while the entry lives
        self.text = bytearray()
        self.cuts: dict[int, int] = {0: 0}

    def upto(self, n: int) -> bytes | None:
        """The text of ``prefix[:n]``; extends the text when ``n`` is past its end, None when ``n``
        falls inside it at a length never cut at (the caller encodes it whole)."""
        if n in self.cuts:
            return bytes(memoryview(self.text)[: self.cuts[n]])
        end = max(self.cuts)
        if n < end:
            return None
        more = _encode(self.prefix[end:n])
        if more:
            if self.text:
                self.text += b","
            self.text += more
        self.cuts[n] = len(self.text)
        return bytes(self.text)


class IdsJson:
    """Encodes prompts as a JSON array, reusing the text of prefixes seen before."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def array(self, ids: Sequence[int]) -> bytes:
        """``[1,2,3]``: the JSON of ``ids``."""
        if not isinstance(ids, PrefixView):
            return b"[" + _encode(ids) + b"]"
        head = self._prefix_text(ids.prefix, ids.prefix_len)
        tail = _encode(ids.delta)
        sep = b"," if head and tail else b""
        return b"[" + head + sep + tail + b"]"

    def _prefix_text(self, prefix: Sequence[int], n: int) -> bytes:
        key = id(prefix)
        entry = self._entries.get(key)
        if entry is None or entry.prefix is not prefix:
            entry = _Entry(prefix)
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        text = entry.upto(n)
        return _encode(prefix[:n]) if text is None else text
