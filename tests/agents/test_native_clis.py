"""Real Claude Code, Codex, Gemini CLI, Qwen Code, mini-swe-agent and openclaw in a real bubblewrap sandbox with the network off.

Each CLI (pinned, installed by scripts/install-agents.sh) reaches a scripted model on the host only
through the Unix socket bound into the sandbox, in its own dialect (Anthropic Messages, OpenAI
Responses, chat completions). The script asks for one shell command, then answers with what the
command printed, so each test is a two-step tool loop: the file the command wrote must exist in the
workspace, the command's output must come back to the model as a tool result, and the answer must be
the model's final text. The end-to-end runs through the real TITO proxy are in
tests/agents/test_native_clis_rollout.py.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dressage.agents import (
    Agent,
    ClaudeCodeAgent,
    CodexAgent,
    GeminiCliAgent,
    MiniSweAgent,
    OpenClawAgent,
    QwenCodeAgent,
    Task,
)
from dressage.agents.config import (
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    GeminiCliAgentConfig,
    MiniSweAgentConfig,
    OpenClawAgentConfig,
    QwenCodeAgentConfig,
)
from dressage.agents.native_clis import session_root
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from tests.agents.conftest import make_context, play, requires_bwrap
from tests.agents.scripted_dialects import Reply, ScriptedDialects, Seen

pytestmark = [pytest.mark.anyio, requires_bwrap]

COMMAND = "printf 'made by the tool' > made.txt && echo tool-ran-ok"
SANDBOX_MB = 2048


def cli_in_usr(name: str) -> str | None:
    """Why ``name`` cannot run in a bwrap sandbox here, or None."""
    found = shutil.which(name)
    if found and found.startswith("/usr/"):
        return None
    return f"{name} is not installed under /usr where bwrap sandboxes see it: run scripts/install-agents.sh"


def command_output(result: str) -> str:
    """``tool-ran-ok`` when the tool result holds the command's output, else its last line (Codex
    and Qwen Code wrap a command's output in a header and a footer)."""
    return "tool-ran-ok" if "tool-ran-ok" in result else (result.strip().splitlines() or [""])[-1].strip()


SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def mini_submission(answer: str) -> dict[str, str]:
    """mini-swe-agent's ``bash`` arguments that submit ``answer`` (the output after its marker line)."""
    return {"command": f"printf '{SUBMIT}\\n%s\\n' {shlex.quote(answer)}"}


def two_step(tool: str, arguments: dict[str, Any]) -> Any:
    """Script: ask for ``tool`` once (on a request offering tools), then answer with the last line of
    its result (Codex wraps a command's output in a header)."""

    def script(seen: Seen) -> Reply:
        if seen.tool_results:
            return Reply(text=f"final answer: {command_output(seen.tool_results[-1])}")
        if seen.body.get("tools"):
            return Reply(tool=tool, arguments=arguments)
        return Reply(text="side request")

    return script


async def run_cli(
    agent: Agent, llm: ScriptedDialects, prompt: str, timeout_s: float = 240
) -> tuple[Any, Any]:
    """Run ``agent`` in a fresh network-less bwrap sandbox wired to ``llm``; return (result, sandbox files)."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "proxy.sock")
        server = await serve_unix_socket_forwarder(sock, "127.0.0.1", llm.port)
        spec = SandboxSpec(
            provider="bwrap", memory_mb=SANDBOX_MB, max_processes=256, proxy_socket=sock, proxy_port=18080
        )
        sb = await get_provider("bwrap").create(f"agent-test-{agent.name}", spec)
        try:
            ctx = make_context(
                Task(index=0, prompt=prompt),
                sb,
                "http://unused.invalid/v1",
                sandbox_base_url="http://127.0.0.1:18080/s/sk-test-token/v1",
                timeout_s=timeout_s,
            )
            try:
                result = await play(agent, ctx)
            except Exception as e:
                raise AssertionError(f"{e}\n--- agent log ---\n{ctx.log.text()[-6000:]}") from e
            made = (await sb.read_file("made.txt")).decode()
            # The session token is never at rest in the workspace (which is archived as an artifact).
            leaks = await sb.exec("grep -rlF sk-test-token . || true", timeout=60)
            assert leaks.stdout.strip() == "", f"session token written to: {leaks.stdout}"
            return result, (made, ctx.log.text())
        finally:
            server.close()
            await sb.terminate()


def assert_two_step_loop(
    llm: ScriptedDialects, dialect: str, credential: str, result: Any, made: str, log: str
) -> None:
    """The shared assertions: one dialect, the token everywhere, the tool ran, its output came back."""
    assert llm.requests, log[-3000:]
    assert {s.dialect for s in llm.requests} == {dialect}, log[-3000:]
    assert {s.token for s in llm.requests} == {"sk-test-token"}
    assert {s.credential for s in llm.requests} == {credential}
    assert {s.body.get("model") for s in llm.requests} == {"test-model"}
    assert made == "made by the tool"
    after = [s for s in llm.requests if s.tool_results]
    assert after and "tool-ran-ok" in after[0].tool_results[-1], log[-3000:]
    assert result.answer == "final answer: tool-ran-ok", log[-3000:]


def test_session_root_strips_v1() -> None:
    assert session_root("http://127.0.0.1:18080/s/tok/v1") == "http://127.0.0.1:18080/s/tok"
    assert session_root("http://127.0.0.1:18080/s/tok/v1/") == "http://127.0.0.1:18080/s/tok"


@pytest.mark.skipif(cli_in_usr("claude") is not None, reason=str(cli_in_usr("claude")))
async def test_claude_code_runs_a_tool_loop_offline_over_anthropic_messages() -> None:
    llm = ScriptedDialects(two_step("Bash", {"command": COMMAND, "description": "Write a file"}))
    with llm.running():
        result, (made, log) = await run_cli(ClaudeCodeAgent(ClaudeCodeAgentConfig()), llm, 'make "made.txt"')
    assert_two_step_loop(llm, "messages", "sk-test-token", result, made, log)
    first = next(s for s in llm.requests if s.body.get("tools"))
    assert first.body["stream"] is True
    assert {"Bash", "Read", "Write"} <= {t["name"] for t in first.body["tools"]}
    # The prompt reaches the model exactly, as the last text block of the first user message.
    assert first.body["messages"][0]["content"][-1] == {"type": "text", "text": 'make "made.txt"'}


@pytest.mark.skipif(cli_in_usr("codex") is not None, reason=str(cli_in_usr("codex")))
async def test_codex_runs_a_tool_loop_offline_over_openai_responses() -> None:
    llm = ScriptedDialects(two_step("exec_command", {"cmd": COMMAND}))
    with llm.running():
        result, (made, log) = await run_cli(CodexAgent(CodexAgentConfig()), llm, 'make "made.txt"')
    assert_two_step_loop(llm, "responses", "Bearer sk-test-token", result, made, log)
    first = llm.requests[0]
    assert first.body["stream"] is True and first.body["store"] is False
    # Offline switches: no hosted web search, no multi-agent / goal tools.
    types = {(t.get("type"), t.get("name")) for t in first.body["tools"]}
    assert ("function", "exec_command") in types
    assert not any(kind in ("web_search", "namespace") for kind, _ in types), types
    user = [i for i in first.body["input"] if i.get("role") == "user"]
    assert user[-1]["content"][-1]["text"] == 'make "made.txt"'


@pytest.mark.slow
@pytest.mark.timeout(1200)  # openclaw starts slowly (see tests/agents/test_native_clis_rollout.py)
@pytest.mark.skipif(cli_in_usr("openclaw") is not None, reason=str(cli_in_usr("openclaw")))
async def test_openclaw_runs_a_tool_loop_offline_over_chat_completions() -> None:
    llm = ScriptedDialects(two_step("exec", {"command": COMMAND}))
    with llm.running():
        result, (made, log) = await run_cli(
            OpenClawAgent(OpenClawAgentConfig()), llm, 'make "made.txt"', timeout_s=900
        )
    assert_two_step_loop(llm, "chat", "Bearer sk-test-token", result, made, log)
    first = llm.requests[0]
    # The prompt reaches the model verbatim inside a user message: openclaw prefixes a timestamp
    # ("[Tue 2026-12-01 21:27 UTC] ...") and appends its runtime context.
    users = [m["content"] for m in first.body["messages"] if m["role"] == "user"]
    texts = [u if isinstance(u, str) else "".join(p.get("text", "") for p in u) for u in users]
    assert first.body["stream"] is True and any('] make "made.txt"' in t for t in texts), texts


@pytest.mark.skipif(cli_in_usr("qwen") is not None, reason=str(cli_in_usr("qwen")))
async def test_qwen_code_runs_a_tool_loop_offline_over_chat_completions() -> None:
    llm = ScriptedDialects(two_step("run_shell_command", {"command": COMMAND}))
    with llm.running():
        result, (made, log) = await run_cli(QwenCodeAgent(QwenCodeAgentConfig()), llm, 'make "made.txt"')
    assert_two_step_loop(llm, "chat", "Bearer sk-test-token", result, made, log)
    first = next(s for s in llm.requests if s.body.get("tools"))
    assert first.body["stream"] is True
    assert "run_shell_command" in {t["function"]["name"] for t in first.body["tools"]}
    users = [m["content"] for m in first.body["messages"] if m["role"] == "user"]
    texts = [u if isinstance(u, str) else "".join(p.get("text", "") for p in u) for u in users]
    assert any('make "made.txt"' in t for t in texts), texts


@pytest.mark.skipif(cli_in_usr("mini-swe-agent") is not None, reason=str(cli_in_usr("mini-swe-agent")))
async def test_mini_swe_agent_runs_a_tool_loop_offline_over_chat_completions() -> None:
    def script(seen: Seen) -> Reply:  # mini-swe-agent answers only by submitting through its bash tool
        if seen.tool_results:
            return Reply(
                tool="bash",
                arguments=mini_submission(f"final answer: {command_output(seen.tool_results[-1])}"),
            )
        return Reply(tool="bash", arguments={"command": COMMAND})

    llm = ScriptedDialects(script)
    with llm.running():
        result, (made, log) = await run_cli(MiniSweAgent(MiniSweAgentConfig()), llm, 'make "made.txt"')
    assert_two_step_loop(llm, "chat", "Bearer sk-test-token", result, made, log)
    first = llm.requests[0]
    assert [t["function"]["name"] for t in first.body["tools"]] == ["bash"]
    users = [m["content"] for m in first.body["messages"] if m["role"] == "user"]
    texts = [u if isinstance(u, str) else "".join(p.get("text", "") for p in u) for u in users]
    assert any('Please solve this issue: make "made.txt"' in t for t in texts), texts


@pytest.mark.skipif(cli_in_usr("gemini") is not None, reason=str(cli_in_usr("gemini")))
async def test_gemini_cli_runs_a_tool_loop_offline_over_the_gemini_api() -> None:
    llm = ScriptedDialects(two_step("run_shell_command", {"command": COMMAND}))
    with llm.running():
        result, (made, log) = await run_cli(GeminiCliAgent(GeminiCliAgentConfig()), llm, 'make "made.txt"')
    assert_two_step_loop(llm, "gemini", "sk-test-token", result, made, log)
    first = next(s for s in llm.requests if s.body.get("tools"))
    names = {d["name"] for t in first.body["tools"] for d in t.get("functionDeclarations", [])}
    assert "run_shell_command" in names
    texts = [
        "".join(p.get("text", "") for p in c["parts"]) for c in first.body["contents"] if c["role"] == "user"
    ]
    assert any('make "made.txt"' in t for t in texts), texts
