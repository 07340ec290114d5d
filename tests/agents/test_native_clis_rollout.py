"""``dressage-worker rollout`` with the agent CLI kinds (Claude Code, Codex, Gemini CLI, openclaw, Qwen Code,
mini-swe-agent), end to end.

The worker (a real child process, started as the CLI is) runs its in-process TITO proxy in front of a
scripted SGLang-protocol engine (tests/scripted_engine.py) and the real agent CLI in a real
bubblewrap sandbox with the network off, reaching the proxy through the Unix-socket forwarder in
its own dialect: Anthropic Messages, OpenAI Responses, chat completions. The scripted model calls the
shell once, then answers with the command's output; the ``contains`` reward checks it. Every turn the
proxy recorded must equal, id for id, a prompt the engine received and the ids it returned.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agents.test_native_clis import COMMAND, cli_in_usr, command_output, mini_submission
from tests.rollout.conftest import open_store, requires_bwrap, worker_env, write_config, write_tasks
from tests.scripted_engine import Script, ScriptedEngine, logprob_of, qwen_tool_call

pytestmark = [requires_bwrap, pytest.mark.slow]

PROMPT = 'Create "made.txt" with a shell command, then tell me what the command printed.'
CASES = {
    "claude_code": ("claude", "Bash", {"command": COMMAND, "description": "Write a file"}, "messages"),
    "codex": ("codex", "exec_command", {"cmd": COMMAND}, "responses"),
    "openclaw": ("openclaw", "exec", {"command": COMMAND}, "chat"),
    "qwen_code": ("qwen", "run_shell_command", {"command": COMMAND}, "chat"),
    "mini_swe_agent": ("mini-swe-agent", "bash", {"command": COMMAND}, "chat"),
    "gemini_cli": ("gemini", "run_shell_command", {"command": COMMAND}, "gemini"),
}
SUBMITS = {"mini_swe_agent"}
"""Kinds that answer only through a tool call (mini-swe-agent submits with its ``bash`` tool)."""
# What each CLI sends that the proxy accepts without effect: recorded on the turn, never silent.
IGNORED = {
    "claude_code": {"metadata", "output_config.effort", "context_management"},
    "codex": {"client_metadata", "prompt_cache_key", "parallel_tool_calls"},
    "openclaw": set(),
    "qwen_code": set(),
    "mini_swe_agent": set(),
    "gemini_cli": set(),
}


def scripted_policy(tool: str, arguments: dict[str, str], submit: bool = False) -> Script:
    """The model: call ``tool`` while no tool response is in the prompt and the tool is offered,
    then answer with the command's output (``submit``: as a mini-swe-agent submission through
    ``tool``); ``side request`` otherwise. A prompt that ends in an open ``<think>`` gets a short
    reasoning block first."""

    def script(prompt: str, _n: int, _sampling: Mapping[str, Any]) -> str:
        responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt, re.DOTALL)
        if responses:
            body = "final answer: " + command_output(responses[-1])
            if submit:
                body = qwen_tool_call(tool, **mini_submission(body))
        elif f'"name": "{tool}"' in prompt:
            body = qwen_tool_call(tool, **arguments)
        else:
            body = "side request"
        return ("The task needs one command.\n</think>\n\n" if prompt.endswith("<think>\n") else "") + body

    return script


def run_worker(
    tmp_path: Path, engine: ScriptedEngine, kind: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``dressage-worker rollout --config run.yaml`` for one task, one sample, one attempt."""
    write_tasks(tmp_path / "tasks.jsonl", [{"prompt": PROMPT, "label": "tool-ran-ok"}])
    cfg = write_config(
        tmp_path,
        engine.url,
        n_samples_per_prompt=1,
        agent={"kind": kind},
        sampling={"max_tokens": 1024, "enable_thinking": None},
        sandbox={
            "network": False,
            "memory_mb": 2048,
            "max_processes": 256,
            "timeout_s": timeout_s,
            "max_timeout_s": timeout_s,
        },
        worker={"session_timeout_s": timeout_s, "max_attempts": 1, "concurrency": 1},
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from dressage.cli import main; main()",
            "rollout",
            "--no-progress",
            "--config",
            str(cfg),
            "--database-url",
            db,
        ],
        cwd=tmp_path,
        env=worker_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=timeout_s + 120,
    )


# openclaw is slow to start (about 35 s of onboarding and 40 s of preparation per run on two idle
# cores, several minutes on busy ones): more than pytest-timeout's default 300 s.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", list(CASES))
def test_agent_cli_rollout_through_the_proxy_is_recorded_token_exact(tmp_path: Path, kind: str) -> None:
    binary, tool, arguments, dialect = CASES[kind]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    timeout_s = 900.0 if kind == "openclaw" else 240.0
    script = scripted_policy(tool, arguments, submit=kind in SUBMITS)
    engine = ScriptedEngine(script)
    with engine.running():
        proc = run_worker(tmp_path, engine, kind, timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home")
    try:
        runs = store.runs.list()
        assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        run = runs[0]
        (session,) = store.sessions.list(run)
        log = _agent_log(store, run, session.id)
        assert session.status == "finished", f"{session.error}\n{log[-4000:]}"
        assert session.reward == 1.0, log[-4000:]
        turns = store.turns.read(run, with_experts=False)
        decode = engine.profile.tokenizer.decode
        texts = [decode([int(i) for i in t.generated_ids]) for t in turns]
        prompts = [decode([int(i) for i in t.context_ids]) for t in turns]
        # The tool loop: a turn that called the tool, then one that answered from its output.
        called = [i for i, text in enumerate(texts) if f"<function={tool}>" in text]
        answered = [i for i, text in enumerate(texts) if "final answer: tool-ran-ok" in text]
        assert called and answered and called[0] < answered[-1], texts
        assert "tool-ran-ok" in prompts[answered[-1]].rsplit("<tool_response>", 1)[-1]
        assert {t.info.get("dialect") for t in turns} == {dialect}
        assert all(IGNORED[kind] <= set(t.info.get("ignored_params", [])) for t in turns), [
            t.info for t in turns
        ]
        _assert_token_exact(engine, script, turns)
    finally:
        store.close()


def _assert_token_exact(engine: ScriptedEngine, script: Script, turns: list[Any]) -> None:
    """Each recorded turn is one engine call: the segment's tokens so far plus the turn's context are
    a prompt the engine got, and its generated ids and logprobs are exactly what the engine returned
    for that prompt (``context_ids`` hold only the tokens added since the segment's previous turn)."""
    assert len(turns) == len(engine.prompts)
    profile = engine.profile
    so_far: dict[tuple[str, int], list[int]] = {}
    for t in sorted(turns, key=lambda t: (t.session_id, t.turn_index)):
        key = (t.session_id, t.segment_index)
        prompt_ids = so_far.get(key, []) + [int(i) for i in t.context_ids]
        prompt = profile.tokenizer.decode(prompt_ids)
        assert prompt in engine.prompts
        expected = [*profile.tokenizer.encode(script(prompt, 0, {})), profile.turn_end_id]
        assert [int(i) for i in t.generated_ids] == expected
        want = np.asarray([logprob_of(i) for i in expected], dtype=np.float32)
        assert np.array_equal(np.asarray(t.logprobs, dtype=np.float32), want)
        assert t.loss_mask.all()
        so_far[key] = prompt_ids + expected


def _agent_log(store: Any, run: Any, session_id: str) -> str:
    """The session's ``agent.log`` artifact, for failure messages."""
    for a in store.artifacts.list(run, session_id=session_id):
        if a.name == "agent.log":
            return store.artifacts.get(a).decode(errors="replace")
    return ""
