"""The HotpotQA agents: a whitebox search agent and its oracle.

:class:`SearchAgent` loops: a chat completion with the ``search`` and ``open`` tools
(:mod:`recipes.hotpotqa.search`), each call run and its result sent back as a ``tool`` message,
until the model replies without a tool call (its text is the answer) or ``max_turns`` is reached.
Every search and its results are turns of the recorded conversation. The index is built and
searched in a thread, so the worker's event loop (and its proxy) never waits on it.

:class:`OracleSearchAgent` plays the known solution through the proxy (:mod:`recipes.forcing`): for
each supporting paragraph, ``search`` its title and ``open`` it, then answer with the label (reward
1); ``mode: wrong`` answers ``unknown`` instead (reward 0).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from dressage.agents.base import Agent, AgentContext, AgentResult
from dressage.agents.whitebox import _complete
from dressage.errors import AgentError, ConfigError
from recipes.extras import require
from recipes.forcing import forced_reply, tool_call_text
from recipes.hotpotqa.search import TOOLS, SearchIndex, index_for

SYSTEM_PROMPT = (
    "You answer multi-hop questions by searching a collection of Wikipedia paragraphs. Call search "
    "with keywords, open a title to read its sentences, and search again for the next hop. When you "
    "know the answer, reply with the answer alone."
)
WRONG_ANSWER = "unknown"


def _index(ctx: AgentContext, corpus: str, top_k: int) -> SearchIndex:
    meta = ctx.task.metadata.get("hotpotqa")
    if not isinstance(meta, dict):
        raise AgentError(
            f"task {ctx.task.id or ctx.task.index} is not a HotpotQA task (no metadata.hotpotqa)"
        )
    try:
        return index_for(meta, corpus, top_k)
    except FileNotFoundError as e:
        raise AgentError(str(e)) from None


class SearchAgent(Agent):
    """The whitebox search agent (see the module docstring)."""

    name = "hotpotqa-search"

    def __init__(
        self,
        system_prompt: str | None = None,
        max_turns: int = 6,
        top_k: int = 3,
        corpus: Literal["dataset", "question"] = "dataset",
    ) -> None:
        if corpus not in ("dataset", "question"):
            raise ConfigError(f"agent option corpus must be 'dataset' or 'question', got {corpus!r}")
        require("bm25s", "hotpotqa")  # at config load: a missing extra stops the run before it starts
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self.max_turns, self.top_k, self.corpus = max_turns, top_k, corpus

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Search and open until the model answers without a tool call."""
        index = await asyncio.to_thread(_index, ctx, self.corpus, self.top_k)
        messages = ctx.task.chat_messages(self.system_prompt)
        answer = ""
        for turn in range(1, self.max_turns + 1):
            msg = (await _complete(ctx, messages, tools=TOOLS)).choices[0].message
            answer = msg.content or ""
            calls = list(msg.tool_calls or [])
            if not calls:
                messages.append({"role": "assistant", "content": answer})
                return AgentResult(answer, "answered", turn, messages)
            messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
            for call in calls:
                output = await asyncio.to_thread(index.call, call.function.name, call.function.arguments)
                ctx.log.write(
                    f"turn {turn}: {call.function.name}({call.function.arguments[:200]}) -> {output[:300]!r}"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        return AgentResult(answer, "max_turns", self.max_turns, messages)


class OracleSearchAgent(Agent):
    """Searches and opens each supporting paragraph, then answers the label (see the module docstring)."""

    name = "hotpotqa-oracle"

    def __init__(self, mode: Literal["correct", "wrong"] = "correct", top_k: int = 3) -> None:
        if mode not in ("correct", "wrong"):
            raise ConfigError(f"agent option mode must be 'correct' or 'wrong', got {mode!r}")
        require("bm25s", "hotpotqa")
        self.mode, self.top_k = mode, top_k

    async def run(self, ctx: AgentContext) -> AgentResult:
        """The known solution's turns, each forced through the proxy."""
        index = await asyncio.to_thread(_index, ctx, "dataset", self.top_k)
        messages = ctx.task.chat_messages(SYSTEM_PROMPT)
        titles = list(dict.fromkeys(str(t) for t, _ in ctx.task.metadata["hotpotqa"]["supporting_facts"]))
        steps: list[tuple[str, dict[str, Any]]] = []
        for title in titles:
            steps += [("search", {"query": title}), ("open", {"title": title})]
        for name, args in steps:
            msg = await forced_reply(ctx, messages, tool_call_text(name, args), TOOLS)
            messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
            for call in msg.tool_calls or []:
                output = await asyncio.to_thread(index.call, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        answer = str(ctx.task.label) if self.mode == "correct" else WRONG_ANSWER
        msg = await forced_reply(ctx, messages, answer, TOOLS)
        messages.append({"role": "assistant", "content": msg.content or ""})
        return AgentResult(msg.content or "", "answered", len(steps) + 1, messages)
