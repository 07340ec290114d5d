"""Whitebox agents with scripted misbehaviour, loaded by dotted path from test configs."""

from __future__ import annotations

import asyncio
import os

from dressage.agents import Agent, AgentContext, AgentResult, CodingAgent, ResumePoint
from tests.scripted_engine import COUNT_TOOL


class EchoAgent(Agent):
    """Answers with the prompt plus a suffix (no model call)."""

    name = "echo"

    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix

    async def run(self, ctx: AgentContext) -> AgentResult:
        return AgentResult(answer=ctx.task.prompt_text() + self.suffix)


class CrashingAgent(Agent):
    """Raises on the task whose label is ``crash`` (a bug in user code); otherwise asks the model once."""

    name = "crashing"

    async def run(self, ctx: AgentContext) -> AgentResult:
        if ctx.task.label == "crash":
            raise RuntimeError("boom: the agent has a bug")
        if ctx.task.label == "hang":
            await asyncio.sleep(3600)
        resp = await ctx.client.chat.completions.create(
            model=ctx.model, messages=ctx.task.chat_messages(), max_tokens=4
        )
        return AgentResult(answer=resp.choices[0].message.content or "", turns=1)


async def slow_answer(ctx: AgentContext) -> str:
    """An async-function agent: one model call, then a pause so a test can kill the worker mid-run."""
    resp = await ctx.client.chat.completions.create(
        model=ctx.model, messages=ctx.task.chat_messages(), max_tokens=4
    )
    await asyncio.sleep(float(os.environ.get("DRESSAGE_TEST_AGENT_SLEEP", "0.5")))
    return resp.choices[0].message.content or ""


async def multi_turn(ctx: AgentContext) -> str:
    """Four model calls in one conversation (each a tool call answered by a tool result), with a
    pause between them (``DRESSAGE_TEST_AGENT_SLEEP``) so a test can kill a proxy mid-session; each
    reply at most ``DRESSAGE_TEST_AGENT_MAX_TOKENS`` tokens (64 unless set: a drill on the tiny
    model's engine spends its time generating them)."""
    messages = ctx.task.chat_messages()
    reply = ""
    max_tokens = int(os.environ.get("DRESSAGE_TEST_AGENT_MAX_TOKENS", "64"))
    for k in range(4):
        resp = await ctx.client.chat.completions.create(
            model=ctx.model,
            messages=messages,
            tools=[COUNT_TOOL],  # type: ignore[list-item]
            max_tokens=max_tokens,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        msg = resp.choices[0].message
        reply = msg.content or ""
        calls = msg.tool_calls or []
        messages = [*messages, msg.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"counted {k}"} for c in calls]
        await asyncio.sleep(float(os.environ.get("DRESSAGE_TEST_AGENT_SLEEP", "0.2")))
    return reply


async def fails_while_flagged(ctx: AgentContext) -> str:
    """Crashes while the file named by ``DRESSAGE_TEST_FAIL_FLAG`` exists (an agent failure a test
    can end); otherwise one model call."""
    flag = os.environ.get("DRESSAGE_TEST_FAIL_FLAG")
    if flag and os.path.exists(flag):
        raise RuntimeError("flagged to fail")
    resp = await ctx.client.chat.completions.create(
        model=ctx.model, messages=ctx.task.chat_messages(), max_tokens=4
    )
    return resp.choices[0].message.content or ""


class NoResumeCodingAgent(CodingAgent):
    """The coding agent without a resume entry point (as an agent of your own that has none): forks
    and take-overs of its sessions replay."""

    name = "coding-no-resume"

    def resume_refusal(self, point: ResumePoint) -> str | None:
        return Agent.resume_refusal(self, point)


class MisremembersCodingAgent(CodingAgent):
    """The coding agent whose resume changes the recorded conversation (a resume entry point with a
    bug): its first request does not render to the recorded prompt, so a fork falls back to replay."""

    name = "coding-misremembers"

    async def resume(self, ctx: AgentContext, point: ResumePoint) -> AgentResult:
        messages = [dict(m) for m in point.request["messages"]]
        messages[-1]["content"] = str(messages[-1].get("content", "")) + " (resumed)"
        return await super().resume(
            ctx, ResumePoint(point.turn_index, point.dialect, {**point.request, "messages": messages})
        )
