"""Claude Code and Codex started in their own resume mode from a checkpointed workspace (issue 38).

Real CLIs in a network-less bwrap sandbox behind a scripted model (as in ``test_native_clis.py``).
The parent session runs two shell tool calls; when its request K = 2 arrives, the host copies the
sandbox's workspace (the checkpoint: the task's files and the CLI's state directory with its session
file). A fresh sandbox gets the copy, :meth:`BlackboxAgent.resume_command` finds the session and
starts the CLI in its resume mode; both first requests are rendered to prompt ids as the proxy does
(the dialect's parser, the TITO renderer, the qwen3.5 tokenizer) and compared with
:func:`check_first_request`.

Measured (and asserted): inside a tool loop the resumed request never equals the parent's request
K, because both CLIs append a user turn (Claude Code also an assistant ``No response requested.``),
so the check names the difference and the caller replays. At a user-turn boundary (the parent's
request K is the first request of a follow-up input) the resumed request is the parent's, token for
token. A CLI without a resume mode, or a checkpoint without the session files, reports why.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from dressage.agents import ClaudeCodeAgent, CodexAgent, GeminiCliAgent, MiniSweAgent, Task
from dressage.agents.base import AgentContext, ResumePoint
from dressage.agents.blackbox import BlackboxAgent
from dressage.agents.cli_resume import (
    RESUME_MODES,
    CliResumeMode,
    NoResume,
    ResumeCommand,
    check_first_request,
)
from dressage.agents.config import (
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    GeminiCliAgentConfig,
    MiniSweAgentConfig,
)
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from dressage.proxy.dialects.messages import parse_messages_request
from dressage.proxy.dialects.responses import ResponsesDialect
from dressage.proxy.sessions import SessionState
from dressage.tito import get_profile
from dressage.tito.model_profile import FullRenderer
from tests.agents.conftest import make_context, requires_bwrap
from tests.agents.scripted_dialects import Reply, ScriptedDialects, Seen
from tests.agents.test_native_clis import cli_in_usr

pytestmark = [pytest.mark.anyio, requires_bwrap]
PROFILE = get_profile("qwen3.5")
K = 2
CASES: dict[str, tuple[str, Callable[[], BlackboxAgent], str, str]] = {
    "claude_code": ("claude", lambda: ClaudeCodeAgent(ClaudeCodeAgentConfig()), "Bash", "command"),
    "codex": ("codex", lambda: CodexAgent(CodexAgentConfig()), "exec_command", "cmd"),
}


def prompt_ids(seen: Seen) -> list[int]:
    """The request rendered to prompt ids as the proxy renders a session's first request."""
    raw = json.dumps(seen.body).encode()
    if seen.dialect == "messages":
        conv = parse_messages_request(raw)
    else:  # Codex sends store: false and no previous_response_id, so no session state is read
        conv = ResponsesDialect(PROFILE, "test-model").parse(raw, cast(SessionState, None), None)
    text = FullRenderer(PROFILE).render(conv.messages, conv.tools, conv.enable_thinking).text
    return PROFILE.tokenizer.encode(text)


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body without Codex's per-turn ids (``client_metadata``, input item ``id``s)."""
    out = {k: v for k, v in body.items() if k != "client_metadata"}
    if isinstance(body.get("input"), list):
        out["input"] = [{k: v for k, v in item.items() if k != "id"} for item in body["input"]]
    return out


def decode(ids: list[int]) -> str:
    return PROFILE.tokenizer.decode(ids)


class TwoTools:
    """Two shell calls, then an answer; copies the sandbox's workspace when request K arrives, once
    the CLI's session file holds the K tool results the request carries (it writes the file on its
    own schedule: Claude Code's transcript lagged the request in one of two runs)."""

    def __init__(self, tool: str, arg: str, checkpoint: Path, mode: CliResumeMode | None = None) -> None:
        self.tool, self.arg, self.checkpoint, self.mode = tool, arg, checkpoint, mode
        self.root: Path | None = None

    def __call__(self, seen: Seen) -> Reply:
        if not seen.body.get("tools"):
            return Reply(text="side request")
        n = len(seen.tool_results)
        if n == K and self.root is not None and not self.checkpoint.exists():
            self.wait_for_session_file(n)
            shutil.copytree(self.root, self.checkpoint, symlinks=True)
        if n < K:
            return Reply(tool=self.tool, arguments={self.arg: f"echo {n} > out{n}.txt && echo step-{n}-ok"})
        return Reply(text=f"final answer after {n} results")

    def wait_for_session_file(self, results: int) -> None:
        """Block this request (the CLI keeps writing) until its session file holds ``results``."""
        assert self.mode is not None and self.root is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for f in (self.root / self.mode.state_dir).glob("**/*.jsonl"):
                if fnmatch.fnmatch(str(f.relative_to(self.root)), self.mode.session_glob):
                    if self.mode.tool_results(f.read_text(errors="replace")) >= results:
                        return
            time.sleep(0.05)
        raise AssertionError(f"the session file never held {results} tool results")


@asynccontextmanager
async def sandbox_ctx(
    llm: ScriptedDialects, name: str, restore: Path | None = None
) -> AsyncIterator[AgentContext]:
    """A fresh network-less bwrap sandbox wired to ``llm`` (its workspace a copy of ``restore``)."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "proxy.sock")
        server = await serve_unix_socket_forwarder(sock, "127.0.0.1", llm.port)
        spec = SandboxSpec(
            provider="bwrap", memory_mb=2048, max_processes=256, proxy_socket=sock, proxy_port=18080
        )
        sb = await get_provider("bwrap").create(name, spec)
        if restore is not None:
            shutil.copytree(restore, cast(Any, sb).root, symlinks=True, dirs_exist_ok=True)
        ctx = make_context(
            Task(index=0, prompt="run two commands"),
            sb,
            "http://unused.invalid/v1",
            sandbox_base_url="http://127.0.0.1:18080/s/sk-test-token/v1",
            timeout_s=240,
        )
        try:
            yield ctx
        finally:
            await ctx.client.close()
            server.close()
            await sb.terminate()


def main_requests(llm: ScriptedDialects, start: int = 0) -> list[Seen]:
    return [s for s in llm.requests[start:] if s.body.get("tools")]


async def resumed_first_request(
    llm: ScriptedDialects, agent: BlackboxAgent, checkpoint: Path, next_input: str, name: str
) -> tuple[ResumeCommand, Seen]:
    """Start ``agent`` resumed from ``checkpoint`` in a fresh sandbox; its command and first request."""
    start = len(llm.requests)
    async with sandbox_ctx(llm, name, restore=checkpoint) as ctx:
        command = await agent.resume_command(ctx, next_input)
        assert isinstance(command, ResumeCommand), command
        try:
            result = await agent.run_resumed(ctx, command)
        except Exception as e:
            raise AssertionError(f"{e}\n{ctx.log.text()[-4000:]}") from e
        assert result.answer.startswith("final answer"), ctx.log.text()[-3000:]
    return command, main_requests(llm, start)[0]


@pytest.mark.external
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", list(CASES))
async def test_resume_inside_a_tool_loop_appends_a_user_turn_so_it_falls_back(
    tmp_path: Path, kind: str
) -> None:
    binary, make, tool, arg = CASES[kind]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    checkpoint = tmp_path / "checkpoint"
    script = TwoTools(tool, arg, checkpoint, RESUME_MODES[kind])
    llm = ScriptedDialects(script)
    with llm.running():
        async with sandbox_ctx(llm, f"resume-parent-{kind}") as ctx:
            script.root = cast(Any, ctx.sandbox).root
            parent = await make().run(ctx)
        assert parent.answer == f"final answer after {K} results"
        parent_k = next(s for s in main_requests(llm) if len(s.tool_results) == K)
        assert (checkpoint / "out1.txt").read_text() == "1\n"  # the checkpoint is the workspace at K
        command, first = await resumed_first_request(llm, make(), checkpoint, "Continue.", f"resume-{kind}")
    assert command.mid_tool_loop and command.session_id in command.argv
    assert command.mismatch is not None and "inside a tool loop" in command.mismatch
    # The resumed CLI sends the parent's conversation (both tool results, same system prompt and
    # tools), then a user turn of its own: never the parent's request K.
    assert first.tool_results == parent_k.tool_results
    check = check_first_request(prompt_ids(parent_k), prompt_ids(first), decode)
    assert not check.exact and check.reason
    parent_text, resumed_text = decode(prompt_ids(parent_k)), decode(prompt_ids(first))
    assert "Continue." in resumed_text and "Continue." not in parent_text
    # Qwen3.5 keeps an assistant turn's (empty) reasoning only after the last user message, so the
    # appended user turn already changes how the first tool call renders: that is where they part.
    assert check.reason.startswith("the resumed CLI's first request differs from the parent's request K")
    assert "<think>" in check.reason and "echo 0 > out0.txt" in check.reason
    # In the request bodies: the parent's conversation, then what the resume mode appended.
    if kind == "claude_code":
        extra = first.body["messages"][len(parent_k.body["messages"]) :]
        assert extra == [
            {"role": "assistant", "content": [{"type": "text", "text": "No response requested."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Continue.", "cache_control": {"type": "ephemeral"}}],
            },
        ]
        assert (
            first.body["system"] == parent_k.body["system"] and first.body["tools"] == parent_k.body["tools"]
        )
        assert first.body["metadata"] == parent_k.body["metadata"]  # the same session id
    else:
        extra = first.body["input"][len(parent_k.body["input"]) :]
        assert [(i["role"], i["content"][0]["text"]) for i in extra] == [("user", "Continue.")]
        assert first.body["input"][: len(parent_k.body["input"])] == parent_k.body["input"]
        same = ("tools", "prompt_cache_key")  # Codex sends its instructions as a developer message
        assert [first.body.get(k) for k in same] == [parent_k.body.get(k) for k in same]


@pytest.mark.external
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", list(CASES))
async def test_resume_at_a_user_turn_sends_the_parents_request_token_for_token(
    tmp_path: Path, kind: str
) -> None:
    """The parent answers, then gets a follow-up input (its request K opens that user turn, sent by
    the CLI resumed in the parent's own sandbox); a checkpoint taken before the follow-up, restored
    in a fresh sandbox and resumed with the same input, sends exactly the parent's request K."""
    binary, make, tool, arg = CASES[kind]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    checkpoint = tmp_path / "checkpoint"
    llm = ScriptedDialects(TwoTools(tool, arg, tmp_path / "unused"))
    follow_up = "Now say which files you wrote."
    with llm.running():
        async with sandbox_ctx(llm, f"resume-turn-parent-{kind}") as ctx:
            agent = make()
            await agent.run(ctx)
            shutil.copytree(cast(Any, ctx.sandbox).root, checkpoint, symlinks=True)
            start = len(llm.requests)
            command = await agent.resume_command(ctx, follow_up)
            assert isinstance(command, ResumeCommand) and command.mismatch is None, command
            await agent.run_resumed(ctx, command)
            parent_k = main_requests(llm, start)[0]
        resumed, first = await resumed_first_request(
            llm, make(), checkpoint, follow_up, f"resume-turn-{kind}"
        )
    assert resumed.session_id == command.session_id
    check = check_first_request(prompt_ids(parent_k), prompt_ids(first), decode)
    assert check.exact, check.reason
    # The bodies themselves: Claude Code's is the parent's byte for byte (metadata included);
    # Codex's differs only in ids it makes up per turn, none of which is rendered.
    assert without_ids(first.body) == without_ids(parent_k.body)
    if kind == "claude_code":
        assert first.body == parent_k.body
    assert follow_up in decode(prompt_ids(first))


async def test_a_cli_without_a_resume_mode_or_its_session_files_reports_why(make_sandbox: Any) -> None:
    sb = await make_sandbox()
    ctx = make_context(Task(index=0, prompt="p"), sb, "http://unused.invalid/v1")
    try:
        mini = await MiniSweAgent(MiniSweAgentConfig()).resume_command(ctx, "Continue.")
        assert isinstance(mini, NoResume) and "has no resume mode" in mini.reason
        # Gemini CLI has one, but it resends tool results twice: it replays, saying why.
        gemini = await GeminiCliAgent(GeminiCliAgentConfig()).resume_command(ctx, "Continue.")
        assert isinstance(gemini, NoResume) and "twice" in gemini.reason
        # Claude Code has one, but the workspace holds no session (a checkpoint without its files).
        claude = await ClaudeCodeAgent(ClaudeCodeAgentConfig()).resume_command(ctx, "Continue.")
        assert isinstance(claude, NoResume) and ".dressage/claude/projects" in claude.reason
    finally:
        await ctx.client.close()


def test_a_checkpoint_start_of_a_cli_replays_and_records_why() -> None:
    """The seam the checkpoint code calls (``Agent.resume_refusal``): every CLI replays, saying why."""
    point = ResumePoint(turn_index=3, dialect="messages", request={"messages": []})
    claude = ClaudeCodeAgent(ClaudeCodeAgentConfig()).resume_refusal(point)
    assert claude is not None and "'No response requested.'" in claude and "request 3" in claude, claude
    codex = CodexAgent(CodexAgentConfig()).resume_refusal(point)
    assert codex is not None and "the input as a user message" in codex, codex
    mini = MiniSweAgent(MiniSweAgentConfig()).resume_refusal(point)
    assert mini is not None and "has no resume mode" in mini, mini


def test_first_request_check_names_where_the_requests_part() -> None:
    tok = PROFILE.tokenizer
    parent = tok.encode("<|im_start|>user\nrun two commands<|im_end|>\n<|im_start|>assistant\n")
    assert check_first_request(parent, list(parent)).exact
    extended = check_first_request(parent, parent + tok.encode("Continue."), decode)
    assert not extended.exact and extended.common_prefix == len(parent)
    assert extended.reason is not None and "extends" in extended.reason and "Continue." in extended.reason
    other = tok.encode("<|im_start|>user\nrun three commands<|im_end|>\n")
    differs = check_first_request(parent, other, decode)
    assert not differs.exact and differs.reason is not None and "differs" in differs.reason
    assert "three" in differs.reason and "two" in differs.reason
