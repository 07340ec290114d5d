"""Whitebox agents against a scripted model, with tools running in a real bubblewrap sandbox."""

from __future__ import annotations

import json

import pytest

from dressage.agents import AnswerAgent, CodingAgent, Task, build_agent
from dressage.agents.config import PythonAgentConfig
from dressage.errors import AgentError, ConfigError
from dressage.rollout.rewards import RewardInput, build_scorer
from dressage.rollout.rewards import TestsConfig as ScoredByTests
from tests.agents.conftest import make_context, play
from tests.agents.scripted_llm import ScriptedLLM, tool_call

pytestmark = pytest.mark.anyio

SOLUTION = "def add(a, b):\n    return a + b\n"
CODING_TASK = Task(
    index=0,
    prompt="Implement add(a, b) in solution.py.",
    files={"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
    tests={"test_solution.py": "from solution import add\nassert add(2, 3) == 5\nprint('ok')\n"},
    metadata={"test_command": "python3 test_solution.py"},
)


async def test_answer_agent_sends_sampling_and_returns_text(make_sandbox) -> None:
    sb = await make_sandbox()
    with ScriptedLLM(lambda body: {"content": "hello e"}).running() as llm:
        ctx = make_context(Task(index=0, prompt="say e"), sb, llm.url)
        result = await play(AnswerAgent(system_prompt="be brief"), ctx)
    assert result.answer == "hello e" and result.turns == 1
    body = llm.requests[0]
    assert body["max_tokens"] == 16 and body["messages"][0] == {"role": "system", "content": "be brief"}
    assert llm.auth[0] == "Bearer sk-test-token"


async def test_coding_agent_solves_with_tools_and_tests_reward_scores_it(make_sandbox) -> None:
    """Scripted model: write the solution, run it, answer. The hidden tests then pass in the sandbox."""
    steps = iter(
        [
            {"tool_calls": [tool_call("file_read", json.dumps({"path": "solution.py"}))]},
            {
                "tool_calls": [
                    tool_call("file_write", json.dumps({"path": "solution.py", "content": SOLUTION}))
                ]
            },
            {
                "tool_calls": [
                    tool_call(
                        "shell_exec",
                        json.dumps({"cmd": "python3 -c 'import solution; print(solution.add(1,2))'"}),
                    )
                ]
            },
            {"content": "done"},
        ]
    )
    sb = await make_sandbox(files=CODING_TASK.files)
    with ScriptedLLM(lambda body: next(steps)).running() as llm:
        result = await play(CodingAgent(max_turns=8), make_context(CODING_TASK, sb, llm.url))
    assert result.answer == "done" and result.turns == 4 and result.finish_reason == "answered"
    # The model saw each tool's real output.
    tool_msgs = [m for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "NotImplementedError" in tool_msgs[0]["content"]
    assert "exit_code: 0" in tool_msgs[2]["content"] and "3" in tool_msgs[2]["content"]
    assert not (await sb.list_files()) or "test_solution.py" not in [f.name for f in await sb.list_files()]
    out = await build_scorer(ScoredByTests()).score(RewardInput(CODING_TASK, result.answer, result, sb))
    assert out.reward == 1.0 and out.details["exit_code"] == 0


async def test_tests_reward_fails_unsolved_task(make_sandbox) -> None:
    from dressage.agents import AgentResult

    sb = await make_sandbox(files=CODING_TASK.files)
    out = await build_scorer(ScoredByTests()).score(RewardInput(CODING_TASK, "", AgentResult(answer=""), sb))
    assert out.reward == 0.0 and "NotImplementedError" in out.details["stderr_tail"]


async def test_coding_agent_answers_garbage_after_first_turn(make_sandbox) -> None:
    """A random model emits no tool call: the agent answers after one turn."""
    sb = await make_sandbox()
    with ScriptedLLM(lambda body: {"content": "\u4e00 zq<tool_call> garbage"}).running() as llm:
        result = await play(CodingAgent(), make_context(Task(index=0, prompt="x"), sb, llm.url))
    assert result.turns == 1 and result.answer.endswith("garbage") and len(llm.requests) == 1


async def test_coding_agent_caps_endless_tool_calls_and_reports_bad_arguments(make_sandbox) -> None:
    sb = await make_sandbox()
    with ScriptedLLM(lambda body: {"tool_calls": [tool_call("shell_exec", "{not json")]}).running() as llm:
        result = await play(CodingAgent(max_turns=3), make_context(Task(index=0, prompt="x"), sb, llm.url))
    assert result.finish_reason == "max_turns" and len(llm.requests) == 3
    tool_msgs = [m for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["content"].startswith(
        "error: arguments for shell_exec are not valid JSON"
    )


async def test_unreachable_model_is_an_agent_error(make_sandbox) -> None:
    sb = await make_sandbox()
    ctx = make_context(Task(index=0, prompt="x"), sb, "http://127.0.0.1:9/v1")
    with pytest.raises(AgentError, match="cannot reach the proxy"):
        await play(AnswerAgent(), ctx)


def test_python_agent_paths_fail_clearly() -> None:
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        build_agent(PythonAgentConfig(path="no_such_mod:Agent"))
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        build_agent(PythonAgentConfig(path="dressage.agents:Nope"))
    agent = build_agent(
        PythonAgentConfig(path="tests.rollout.agents_for_tests:EchoAgent", options={"suffix": "!"})
    )
    assert agent.name == "echo"
