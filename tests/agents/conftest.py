"""Fixtures for agent tests: a real bubblewrap sandbox and an AgentContext bound to a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI

from dressage.agents import AgentContext, Task
from dressage.paddock import Sandbox, SandboxSpec, SandboxTools, get_provider
from tests.paddock.conftest import bwrap_unavailable_reason, requires_bwrap

__all__ = ["make_context", "play", "requires_bwrap"]


@pytest.fixture
async def make_sandbox() -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await make_sandbox(files=..., proxy_socket=...)`` -> a live bwrap sandbox."""
    if bwrap_unavailable_reason():
        pytest.skip(str(bwrap_unavailable_reason()))
    made: list[Sandbox] = []

    async def make(**kw: Any) -> Sandbox:
        spec = SandboxSpec(provider="bwrap", timeout_s=20, memory_mb=512, max_processes=64, **kw)
        sb = await get_provider("bwrap").create(f"agent-test-{len(made)}", spec)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.terminate()


def make_context(
    task: Task, sandbox: Sandbox, base_url: str, *, sandbox_base_url: str = "", timeout_s: float = 60.0
) -> AgentContext:
    """An AgentContext whose OpenAI client points at ``base_url``."""
    return AgentContext(
        task=task,
        client=AsyncOpenAI(base_url=base_url, api_key="sk-test-token", max_retries=0),
        model="test-model",
        sandbox=sandbox,
        tools=SandboxTools(sandbox),
        session_id="sess-test",
        token="sk-test-token",
        sandbox_base_url=sandbox_base_url or base_url,
        sampling={"max_tokens": 16, "temperature": 1.0},
        timeout_s=timeout_s,
    )


async def play(agent: Any, ctx: AgentContext) -> Any:
    """Run ``agent`` on ``ctx`` and close its OpenAI client (so no socket outlives the test's loop)."""
    try:
        return await agent.run(ctx)
    finally:
        await ctx.client.close()
