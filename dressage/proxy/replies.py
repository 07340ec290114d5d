"""The reply of a recorded turn, dialect-blind: visible text and its parse into reasoning, content and calls.

A reply is a pure function of the recorded turn (its generated ids and logprobs) and the request
(tools, thinking), so a retried request gets exactly the reply it would have got the first time.
The visible text leaves out the final stop token and anything from a matched stop string on; the
recorded ids keep everything the engine sampled.
"""

from __future__ import annotations

from collections.abc import Sequence

from dressage.proxy.conversation import Conversation
from dressage.proxy.reply_data import ReplyData
from dressage.tito.model_profile import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant


def think_open(profile: ModelProfile, conv: Conversation) -> bool:
    """Whether the generation prompt opened a ``<think>`` block for this request."""
    return profile.think_open(conv.enable_thinking, conv.messages)


def visible_ids(profile: ModelProfile, ids: Sequence[int]) -> list[int]:
    """Generated ids without the trailing stop token (it ends the turn, it is not content)."""
    if ids and ids[-1] in profile.stop_token_ids:
        return list(ids[:-1])
    return list(ids)


def visible_text(profile: ModelProfile, ids: Sequence[int], matched_stop: str | None) -> str:
    """The text the client sees: stop token dropped, cut before a matched stop string."""
    text = profile.tokenizer.decode(visible_ids(profile, ids))
    if matched_stop:
        cut = text.find(matched_stop)
        if cut >= 0:
            text = text[:cut]
    return text


def reply_text(
    profile: ModelProfile, forced_ids: Sequence[int], ids: Sequence[int], matched_stop: str | None
) -> str:
    """The text the reply is parsed from: the forced opening (if any), then :func:`visible_text`."""
    text = visible_text(profile, ids, matched_stop)
    return profile.tokenizer.decode(list(forced_ids)) + text if forced_ids else text


def parse_reply(profile: ModelProfile, conv: Conversation, text: str, seed: str) -> ParsedAssistant:
    """Reasoning, content and tool calls (tool calls only with ``tool_choice`` auto and tools)."""
    if conv.parse_tools:
        return profile.parse_assistant(
            text, tools=conv.tools, enable_thinking=conv.enable_thinking, seed=seed
        )
    reasoning, rest = profile.split_reasoning(text, think_open(profile, conv))
    return ParsedAssistant(content=rest, reasoning_content=reasoning)


def reply_parse(profile: ModelProfile, conv: Conversation, reply: ReplyData) -> ParsedAssistant:
    """The parse of a recorded reply for ``req`` (cached when ``req`` is the request that made it)."""
    if reply.parsed is not None and reply.parsed_for == conv.fingerprint:
        return reply.parsed
    text = reply_text(profile, reply.forced_ids, reply.generated_ids, reply.matched_stop)
    return parse_reply(profile, conv, text, reply.turn_id)
