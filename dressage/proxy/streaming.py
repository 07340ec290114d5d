"""Streaming text for every dialect: incremental detokenization and routing to reasoning / content.

Tokens leave as the engine produces them. :class:`IncrementalDecoder` turns the growing id list
into stable text (it waits while the last bytes are an incomplete UTF-8 character), and
:class:`StreamSplitter` routes that text to ``reasoning_content`` or ``content`` deltas, holding
back only what might still turn out to be markup: a partial ``</think>``, anything from
``<tool_call>`` on (tool calls are sent whole at the end, in each dialect's form), a
partial stop string, and whitespace the final parse may strip. At the end the authoritative parse
(the same one the non-streaming reply uses) supplies whatever was held back, so the concatenated
deltas equal the non-streaming message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from dressage.tito.tokenizer import Tokenizer

THINK_END = "</think>"
TOOL_CALL = "<tool_call>"


def sse(payload: dict[str, object] | str) -> bytes:
    """One ``data:`` event."""
    data = (
        payload
        if isinstance(payload, str)
        else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {data}\n\n".encode()


class IncrementalDecoder:
    """Stable text from a growing list of ids, decoding only a short window each time."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, new_ids: Sequence[int]) -> str:
        """Add ids; return the newly stable text (may be empty)."""
        self.ids.extend(new_ids)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        text = self.tokenizer.decode(self.ids[self._prefix :])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(prefix_text) :]
        return ""


def _holdback(text: str, markers: Sequence[str]) -> str:
    """``text`` without a suffix that could be the start of one of ``markers``."""
    cut = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:k]):
                cut = max(cut, k)
                break
    return text[: len(text) - cut] if cut else text


class StreamSplitter:
    """Routes streamed text to reasoning / content deltas (see the module docstring)."""

    def __init__(
        self,
        think_open: bool,
        parse_tools: bool,
        stops: Sequence[str] = (),
        tool_call_marker: str = TOOL_CALL,
        reasoning: bool = True,
    ) -> None:
        self.think_open = think_open
        self.reasoning = reasoning  # False: the family has no <think> blocks, all text is content
        self.parse_tools = parse_tools
        self.tool_call_marker = tool_call_marker
        self.stops = tuple(stops)
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""

    def _views(self) -> tuple[str, str]:
        """(reasoning, content) that are safe to have sent so far."""
        text = self.text
        for stop in self.stops:
            i = text.find(stop)
            if i >= 0:
                text = text[:i]
        text = _holdback(text, self.stops)
        if not self.reasoning:
            reasoning, content = "", text
        elif THINK_END in text:
            head, _, rest = text.partition(THINK_END)
            head = head.split("<think>", 1)[1] if "<think>" in head else head
            reasoning, content = head.strip("\n"), rest.lstrip("\n")
        elif self.think_open:
            return _holdback(text.removeprefix("<think>"), (THINK_END, "<think>")).strip("\n"), ""
        else:
            reasoning, content = "", _holdback(text, (THINK_END,))
        if self.parse_tools:
            i = content.find(self.tool_call_marker)
            content = content[:i] if i >= 0 else _holdback(content, (self.tool_call_marker,))
        content = content.rstrip()
        if not content.strip():
            content = ""
        return reasoning, content

    def push(self, new_text: str) -> tuple[str, str]:
        """Add stable text; return the (reasoning, content) deltas to send now."""
        self.text += new_text
        reasoning, content = self._views()
        return self._delta(reasoning, content)

    def _delta(self, reasoning: str, content: str) -> tuple[str, str]:
        r = c = ""
        if reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            r = reasoning[len(self.sent_reasoning) :]
            self.sent_reasoning = reasoning
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            c = content[len(self.sent_content) :]
            self.sent_content = content
        return r, c

    def finish(self, reasoning: str | None, content: str | None) -> tuple[str, str]:
        """The final deltas, given the authoritative parse of the whole text."""
        return self._delta(reasoning or "", content or "")
