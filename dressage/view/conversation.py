"""A session's conversation as the agent saw it, rebuilt from the exact tokens of its turns.

The log keeps ids, not messages: each turn's ``context_ids`` (the prompt delta: tool results, user
text, template glue; the whole prompt when the turn opens a segment) and ``generated_ids``. Decoded,
they are chat-template text (``<|im_start|>role\\n...<|im_end|>``), which splits back into messages;
the generated text goes through the same parser the proxy uses for replies
(:func:`~dressage.tito.tool_calls.parse_assistant_text`), so tool calls, arguments and thinking show
as the agent received them. Tool results (``<tool_response>`` blocks in a user message) show as
role ``tool``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dressage.store.records import Turn
from dressage.tito.tool_calls import parse_assistant_text
from dressage.view.decode import TokenDecoder

_MESSAGE = re.compile(r"<\|im_start\|>([^\n<]*)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
DEFAULT_DIALECT = "openai-chat"
"""Turns whose info records no dialect came through the proxy's only route, chat completions."""


@dataclass
class Message:
    """One message: role, text, and for assistant replies the parsed reasoning and tool calls."""

    role: str
    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_failures: list[str] = field(default_factory=list)


@dataclass
class TurnView:
    """A turn as the session page shows it: what the prompt added, the reply, and the turn's facts."""

    turn: Turn
    context_messages: list[Message]
    reply: Message | None
    opens_segment: bool
    dialect: str

    @property
    def n_trained(self) -> int:
        """Generated tokens with loss mask 1."""
        return int(self.turn.loss_mask.sum())

    @property
    def versions(self) -> str:
        """The policy versions of the generated tokens (``3`` or ``3-4``)."""
        v = self.turn.policy_versions
        if not v.size:
            return "-"
        lo, hi = int(v.min()), int(v.max())
        return str(lo) if lo == hi else f"{lo}-{hi}"


def split_messages(text: str) -> list[Message]:
    """Chat-template text to messages; text outside any message is kept as role ``text``."""
    out: list[Message] = []
    pos = 0
    for m in _MESSAGE.finditer(text):
        stray = text[pos : m.start()].replace("<|im_end|>", "").strip()
        if stray:
            out.append(Message("text", stray))
        pos = m.end()
        role, body = m.group(1).strip(), m.group(2)
        if role == "assistant" and not body.strip(" \n"):
            continue  # the generation prompt: the reply follows in the generated ids
        if role == "assistant" and body.strip() == "<think>":
            continue  # a generation prompt that opens thinking
        if role == "user" and _TOOL_RESPONSE.search(body) and not _TOOL_RESPONSE.sub("", body).strip():
            out += [Message("tool", r) for r in _TOOL_RESPONSE.findall(body)]
            continue
        if role == "assistant":
            out.append(_assistant(body, think_open=False))
        else:
            out.append(Message(role or "text", body))
    stray = text[pos:].replace("<|im_end|>", "").strip()
    if stray:
        out.append(Message("text", stray))
    return out


def _assistant(text: str, *, think_open: bool) -> Message:
    body = text.removesuffix("<|endoftext|>").removesuffix("<|im_end|>")
    parsed = parse_assistant_text(body, think_open=think_open, seed="view")
    return Message(
        "assistant",
        parsed.content,
        reasoning=parsed.reasoning_content or None,
        tool_calls=parsed.tool_calls,
        tool_call_failures=[f.reason for f in parsed.failures],
    )


def turn_views(turns: list[Turn], decoder: TokenDecoder) -> list[TurnView]:
    """The conversation of ``turns`` (one session, in turn order)."""
    views = []
    for turn in turns:
        context_text = decoder.text(turn.context_ids)
        reply = None
        if turn.generated_ids.size:
            think_open = context_text.rstrip(" ").endswith("<think>\n") or context_text.endswith("<think>")
            reply = _assistant(decoder.text(turn.generated_ids), think_open=think_open)
        views.append(
            TurnView(
                turn=turn,
                context_messages=split_messages(context_text),
                reply=reply,
                opens_segment=turn.route != "append" or turn.segment_offset == 0,
                dialect=str(turn.info.get("dialect") or DEFAULT_DIALECT),
            )
        )
    return views
