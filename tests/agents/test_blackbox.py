"""Blackbox adapters run real programs inside a real bubblewrap sandbox with the network off.

The model is a scripted OpenAI-compatible server on the host; the sandbox reaches it only through
the Unix socket bound into it (host forwarder -> socket -> in-sandbox loopback forwarder). The
end-to-end test against the real TITO proxy is in tests/rollout/test_rollout_e2e.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dressage.agents import CommandAgent, OpenCodeAgent, Task
from dressage.agents.config import CommandAgentConfig, OpenCodeAgentConfig
from dressage.errors import AgentError
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from dressage.rollout.config import load_config
from tests.agents.conftest import make_context, play, requires_bwrap
from tests.agents.scripted_llm import ScriptedLLM
from tests.loopback import ServedInThread, ThreadedServer

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "examples" / "blackbox.yaml"


async def _forwarded_sandbox(make_sandbox, llm: ScriptedLLM, tmp: str):
    sock = str(Path(tmp) / "proxy.sock")
    server = await serve_unix_socket_forwarder(sock, "127.0.0.1", llm.port)
    sb = await make_sandbox(proxy_socket=sock, proxy_port=18080)
    return server, sb


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="curl and jq are needed")
async def test_curl_command_from_the_example_reaches_the_model_without_network(make_sandbox) -> None:
    """The example config's curl+jq command, unmodified, through the socket forwarder."""
    agent_cfg = load_config(EXAMPLE).agent
    assert isinstance(agent_cfg, CommandAgentConfig)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ScriptedLLM(lambda b: {"content": "an answer with e"}).running() as llm,
    ):
        server, sb = await _forwarded_sandbox(make_sandbox, llm, tmp)
        try:
            # Network really is off: the model's host port is unreachable directly.
            direct = await sb.exec(f"curl -sS --max-time 3 {llm.url}/chat/completions -d '{{}}'")
            assert direct.exit_code != 0
            ctx = make_context(
                Task(index=0, prompt="Say \"e\" 'quoted'"),
                sb,
                llm.url,
                sandbox_base_url="http://127.0.0.1:18080/s/sk-test-token/v1",
            )
            result = await play(CommandAgent(agent_cfg), ctx)
        finally:
            server.close()
    assert result.answer == "an answer with e"
    assert llm.requests[0]["messages"] == [{"role": "user", "content": "Say \"e\" 'quoted'"}]
    assert llm.auth[0] == "Bearer sk-test-token"
    assert "exit_code=0" in ctx.log.text()


async def test_missing_binary_is_a_clear_agent_error(make_sandbox) -> None:
    sb = await make_sandbox()
    agent = CommandAgent(CommandAgentConfig(command=["no-such-agent-cli", "--run"]))
    with pytest.raises(AgentError, match="agent binary 'no-such-agent-cli' not found in the sandbox"):
        await play(agent, make_context(Task(index=0, prompt="x"), sb, "http://127.0.0.1:9/v1"))
    shell = CommandAgent(CommandAgentConfig(command="no-such-agent-cli --run"))
    with pytest.raises(AgentError, match="command not found in the sandbox"):
        await play(shell, make_context(Task(index=0, prompt="x"), sb, "http://127.0.0.1:9/v1"))


async def test_crashing_and_hanging_programs_are_agent_errors(make_sandbox) -> None:
    sb = await make_sandbox()
    crash = CommandAgent(CommandAgentConfig(command="echo partial; echo 'Traceback: kaboom' >&2; exit 3"))
    with pytest.raises(AgentError, match="exited with code 3: Traceback: kaboom"):
        await play(crash, make_context(Task(index=0, prompt="x"), sb, "http://127.0.0.1:9/v1"))
    hang = CommandAgent(CommandAgentConfig(command="trap '' TERM; sleep 600"))
    with pytest.raises(AgentError, match="ran past its timeout of 1s"):
        await play(hang, make_context(Task(index=0, prompt="x"), sb, "http://127.0.0.1:9/v1", timeout_s=1))


async def test_answer_file_wins_over_stdout_and_env_is_set(make_sandbox) -> None:
    sb = await make_sandbox()
    cmd = 'echo noise; printf "%s|%s|%s" "$OPENAI_API_KEY" "$OPENAI_MODEL" "$(cat "$DRESSAGE_PROMPT_FILE")" > "$DRESSAGE_ANSWER_FILE"'
    result = await play(
        CommandAgent(CommandAgentConfig(command=cmd)),
        make_context(Task(index=0, prompt="p1"), sb, "http://x/v1"),
    )
    assert result.answer == "sk-test-token|test-model|p1" and result.info["answer_source"] == "answer_file"


async def test_opencode_adapter_writes_a_provider_config(make_sandbox) -> None:
    """The config opencode reads; running opencode itself is tested where its npm package installs."""
    sb = await make_sandbox()
    agent = OpenCodeAgent(OpenCodeAgentConfig(binary="true"))
    ctx = make_context(
        Task(index=0, prompt="fix it"), sb, "http://x/v1", sandbox_base_url="http://127.0.0.1:18080/s/t/v1"
    )
    await play(agent, ctx)
    cfg = json.loads(await sb.read_file("opencode.json"))
    provider = cfg["provider"]["dressage"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:18080/s/t/v1", "apiKey": "sk-test-token"}
    assert cfg["model"] == "dressage/test-model"
    assert agent.argv(ctx) == 'exec true run --model dressage/test-model <"$DRESSAGE_PROMPT_FILE"'
    assert agent.env(ctx)["OPENCODE_DISABLE_MODELS_FETCH"] == "1"


def _opencode_in_usr() -> str | None:
    found = shutil.which("opencode")
    return found if found and found.startswith("/usr/") else None


OPENCODE_MEMORY_MB = 2048  # the SandboxSpec default; opencode is OOM-killed (exit 137) at 512


class StreamingLLM(ServedInThread):
    """A scripted model that, unlike ScriptedLLM, streams (SSE) when asked: opencode always sends
    ``"stream": true`` and retries forever on a plain JSON reply. Records each request's body, the
    session token from its ``/s/<token>/v1`` path and its Authorization header."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        self.auth: list[str | None] = []
        app = FastAPI()

        async def chat(token: str, request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.tokens.append(token)
            self.auth.append(request.headers.get("authorization"))
            base = {"id": "chatcmpl-1", "created": int(time.time()), "model": body.get("model", "m")}
            if not body.get("stream"):
                msg = {"role": "assistant", "content": self.answer}
                choice = {"index": 0, "message": msg, "finish_reason": "stop"}
                return JSONResponse({**base, "object": "chat.completion", "choices": [choice]})
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                {"choices": [{"index": 0, "delta": {"content": self.answer}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": usage},
            ]
            sse = "".join(
                f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', **c})}\n\n" for c in chunks
            )
            return Response(sse + "data: [DONE]\n\n", media_type="text/event-stream")

        app.add_api_route("/s/{token}/v1/chat/completions", chat, methods=["POST"])
        self._http = ThreadedServer(app)
        self.port = self._http.port
        self.url = f"{self._http.base}/v1"


@pytest.mark.skipif(
    _opencode_in_usr() is None,
    reason="opencode is not installed where bubblewrap sandboxes can see it (/usr): "
    "`npm install -g --prefix /usr opencode-ai @ai-sdk/openai-compatible` enables this test",
)
@requires_bwrap
async def test_opencode_talks_to_the_model_through_the_socket() -> None:
    """Real opencode in bwrap (network off) streams its chat requests from the session URL with the
    token, and its final text is the answer. opencode (a Bun binary) needs more than the fixture's
    512 MB, so this sandbox gets the default 2048 MB (see docs/rollout.md)."""
    with tempfile.TemporaryDirectory() as tmp, StreamingLLM("done").running() as llm:
        sock = str(Path(tmp) / "proxy.sock")
        server = await serve_unix_socket_forwarder(sock, "127.0.0.1", llm.port)
        spec = SandboxSpec(
            provider="bwrap",
            memory_mb=OPENCODE_MEMORY_MB,
            max_processes=64,
            proxy_socket=sock,
            proxy_port=18080,
        )
        sb = await get_provider("bwrap").create("agent-test-opencode", spec)
        try:
            ctx = make_context(
                Task(index=0, prompt='say "done"'),
                sb,
                llm.url,
                sandbox_base_url="http://127.0.0.1:18080/s/sk-test-token/v1",
                timeout_s=120,
            )
            result = await play(OpenCodeAgent(OpenCodeAgentConfig()), ctx)
        finally:
            server.close()
            await sb.terminate()
    log = ctx.log.text()[-3000:]
    assert llm.requests, log
    assert set(llm.tokens) == {"sk-test-token"} and set(llm.auth) == {"Bearer sk-test-token"}, log
    # The agent turn: tools offered, the task's prompt as the user message, streamed.
    turns = [r for r in llm.requests if r.get("tools")]
    assert turns and turns[0]["stream"] is True and turns[0]["model"] == "test-model", log
    assert turns[0]["messages"][-1] == {"role": "user", "content": 'say "done"'}  # exact, via stdin
    assert len(llm.requests) <= 4, f"opencode retried: {len(llm.requests)} requests"
    assert "done" in result.answer and "exit_code=0" in ctx.log.text()
