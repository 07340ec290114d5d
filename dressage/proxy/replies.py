"""Building OpenAI replies from generated token ids.

A reply is a pure function of the recorded turn (its generated ids and logprobs) and the request
(tools, thinking), so a retried request gets exactly the reply it would have got the first time.
The visible text leaves out the final stop token and anything from a matched stop string on; the
recorded ids keep everything the engine sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dressage.proxy.requests import ChatRequest
from dressage.proxy.sessions import ReplyData
from dressage.tito.profiles import ModelProfile
from dressage.tito.tool_calls import ParsedAssistant


def think_open(profile: ModelProfile, req: ChatRequest) -> bool:
    """Whether the generation prompt opened a ``<think>`` block for this request."""
    return profile.think_open(req.enable_thinking)


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


def parse_reply(profile: ModelProfile, req: ChatRequest, text: str, seed: str) -> ParsedAssistant:
    """Reasoning, content and tool calls (tool calls only with ``tool_choice`` auto and tools)."""
    if req.parse_tools:
        return profile.parse_assistant(text, tools=req.tools, enable_thinking=req.enable_thinking, seed=seed)
    reasoning, rest = profile.split_reasoning(text, think_open(profile, req))
    return ParsedAssistant(content=rest, reasoning_content=reasoning)


def finish_reason(stop_reason: str, parsed: ParsedAssistant) -> str:
    """OpenAI finish reason: ``tool_calls`` when calls were parsed, else ``stop`` / ``length``."""
    if parsed.tool_calls and stop_reason == "stop":
        return "tool_calls"
    return "length" if stop_reason == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI usage object (counts agree with the log: prompt = segment tokens before generation)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs_content(
    profile: ModelProfile, ids: Sequence[int], logprobs: Sequence[float]
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content``: one entry per generated token (stop token included)."""
    tok = profile.tokenizer
    out = []
    for token_id, lp in zip(ids, logprobs, strict=True):
        text = tok.decode([token_id])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


def reply_parse(profile: ModelProfile, req: ChatRequest, reply: ReplyData) -> ParsedAssistant:
    """The parse of a recorded reply for ``req`` (cached when ``req`` is the request that made it)."""
    if reply.parsed is not None and reply.parsed_for == req.fingerprint:
        return reply.parsed
    text = reply_text(profile, reply.forced_ids, reply.generated_ids, reply.matched_stop)
    return parse_reply(profile, req, text, reply.turn_id)


def completion_body(
    profile: ModelProfile, req: ChatRequest, reply: ReplyData, model: str
) -> tuple[dict[str, Any], ParsedAssistant]:
    """The ``chat.completion`` object of a recorded turn, and its parse."""
    parsed = reply_parse(profile, req, reply)
    choice: dict[str, Any] = {
        "index": 0,
        "message": parsed.to_message(),
        "finish_reason": finish_reason(reply.stop_reason, parsed),
        "logprobs": None,
    }
    if req.logprobs:
        choice["logprobs"] = {"content": logprobs_content(profile, reply.generated_ids, reply.logprobs)}
    body = {
        "id": f"chatcmpl-{reply.rid or reply.turn_id}",
        "object": "chat.completion",
        "created": reply.created,
        "model": model,
        "choices": [choice],
        "usage": usage(reply.prompt_tokens, len(reply.generated_ids)),
    }
    return body, parsed
