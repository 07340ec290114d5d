"""A scripted whitebox agent for Harbor tasks: one model call through the proxy, then the task's shell block.

The fixture tasks' instructions end with a fenced ``sh`` block; this agent asks the model once (so the
session has a recorded turn, as a real agent's would) and then runs that block in the task's working
directory. The reward therefore depends only on the task, which lets the tests expect exact rewards.
"""

from __future__ import annotations

import re

from dressage.agents import Agent, AgentContext, AgentResult

_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)


class ScriptedHarborAgent(Agent):
    """Asks the model once, then runs the instruction's ``sh`` block (see the module docstring)."""

    name = "scripted-harbor"

    async def run(self, ctx: AgentContext) -> AgentResult:
        resp = await ctx.client.chat.completions.create(
            model=ctx.model, messages=ctx.task.chat_messages(), max_tokens=4
        )
        m = _BLOCK.search(ctx.task.prompt_text())
        assert m is not None, "fixture instructions end with a sh block"
        r = await ctx.sandbox.exec(m.group(1), timeout=30)
        ctx.log.write(f"ran the task's block: exit {r.exit_code}")
        return AgentResult(answer=resp.choices[0].message.content or "", turns=1, info={"exit": r.exit_code})


class IdleAgent(Agent):
    """Does nothing and answers nothing: every task's tests must score it 0."""

    name = "idle"

    async def run(self, ctx: AgentContext) -> AgentResult:
        return AgentResult(answer="", turns=0)
