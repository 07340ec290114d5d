"""Oracle replies recorded as the policy's own: a reply whose text is known, generated through the proxy
under a regex constraint that admits exactly that text.

An oracle agent (the known answer, the walkthrough, the known patch) must leave real turns in the log,
or ``export --format sft`` of its runs has nothing to export. So instead of skipping the model, each
oracle reply is a chat completion constrained (SGLang's ``regex``, which the proxy passes to the
engine) to the literal text the oracle wants: the engine generates it token by token with the
policy's logprobs, the proxy records and parses it like any reply (a tool call comes back as
``tool_calls``), and the agent runs the tool as usual. The text of a tool call is the one the
model profile's chat template writes (:func:`tool_call_text`, Qwen3.5's XML). Thinking must be off
(``sampling.enable_thinking: false``), else the constraint applies only after a free ``<think>``.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from dressage.agents.base import AgentContext
from dressage.errors import AgentError
from dressage.tito.chat_template import render_tool_calls

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-,:;'\"=<>/!@#%&`~")


def literal_regex(text: str) -> str:
    """A regex matching exactly ``text`` in the syntax xgrammar (SGLang's grammar backend) reads:
    metacharacters backslash-escaped, newline, tab and carriage return as ``\\n``, ``\\t``, ``\\r``."""
    out: list[str] = []
    for ch in text:
        if ch in _PLAIN or ord(ch) > 127:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append("\\" + ch)
    return "".join(out)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The assistant text of one tool call, as the Qwen3.5 chat template writes it."""
    return render_tool_calls([{"name": name, "arguments": arguments}], "")


async def forced_reply(
    ctx: AgentContext, messages: list[dict[str, Any]], text: str, tools: list[dict[str, Any]] | None = None
) -> Any:
    """The assistant message of a completion of ``messages`` constrained to generate ``text``.

    ``max_tokens`` is the text's UTF-8 length plus room for the end token (a token holds at least one
    byte); a reply that is not ``text`` (a model profile whose tool-call format differs) is an
    :class:`AgentError` naming both."""
    extra_body: dict[str, Any] = {"regex": literal_regex(text)}
    if ctx.sampling.get("enable_thinking") is not None:
        extra_body["chat_template_kwargs"] = {"enable_thinking": bool(ctx.sampling["enable_thinking"])}
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    try:
        resp = await ctx.client.chat.completions.create(
            model=ctx.model,
            messages=messages,  # type: ignore[arg-type]  # plain dicts: the wire format
            max_tokens=len(text.encode()) + 8,
            temperature=float(ctx.sampling.get("temperature", 1.0)),
            extra_body=extra_body,
            **kwargs,
        )
    except openai.APIStatusError as e:
        raise AgentError(f"the proxy refused an oracle reply (HTTP {e.status_code}): {e.message}") from e
    msg: Any = resp.choices[0].message  # a tool call here is always a function call (the proxy's)
    got = msg.content or ""
    if msg.tool_calls:
        got = "".join(
            tool_call_text(c.function.name, json.loads(c.function.arguments or "{}")) for c in msg.tool_calls
        )
    if got != text:
        raise AgentError(f"an oracle reply came back as {got[:200]!r}, not the forced {text[:200]!r}")
    return msg
