"""The blackbox CLIs on the SWE recipe (external tier): opencode, Claude Code, Codex, Qwen Code, Gemini
CLI and mini-swe-agent, unmodified in the bubblewrap sandbox whose workspace is the checkout, with the network off. A scripted model
(tests/scripted_engine.py) has each CLI's shell tool apply the instance's known patch, then answers;
the SWE reward grades the workspace with SWE-bench's rules: 1.0, resolved, integrity kept."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module

require_module("swebench", "the SWE recipe needs the 'swe' extra")

from recipes.swe.agent import oracle_command  # noqa: E402
from recipes.swe.records import read_records  # noqa: E402
from tests.agents.test_native_clis import cli_in_usr, mini_submission  # noqa: E402
from tests.recipes.swe_fixtures import requires_sandbox_pytest, swe_data  # noqa: E402
from tests.rollout.conftest import open_store, requires_bwrap, worker_env, write_config  # noqa: E402
from tests.scripted_engine import Script, ScriptedEngine, qwen_tool_call  # noqa: E402

pytestmark = [requires_bwrap, requires_sandbox_pytest, pytest.mark.external, pytest.mark.timeout(900)]

CLIS = {
    "opencode": ("opencode", "bash", "command", {"description": "Apply the fix"}),
    "claude_code": ("claude", "Bash", "command", {"description": "Apply the fix"}),
    "codex": ("codex", "exec_command", "cmd", {}),
    "qwen_code": ("qwen", "run_shell_command", "command", {}),
    "gemini_cli": ("gemini", "run_shell_command", "command", {}),
    "mini_swe_agent": ("mini-swe-agent", "bash", "command", {}),
}
"""kind -> (binary, its shell tool, the tool's command argument, other arguments)."""


def fixing_policy(
    tool: str, argument: str, extra: Mapping[str, str], command: str, submit: bool = False
) -> Script:
    """The model: run ``command`` with the CLI's shell tool while no tool response is in the prompt and
    the tool is offered, then say it is done (``submit``: as a mini-swe-agent submission through the
    tool, the only way it ends); ``side request`` for the CLIs' other requests."""

    def script(prompt: str, _n: int, _sampling: Mapping[str, Any]) -> str:
        think = "Apply the fix.\n</think>\n\n" if prompt.endswith("<think>\n") else ""
        if re.search(r"<tool_response>", prompt):
            done = "The fix is applied."
            return think + (qwen_tool_call(tool, **mini_submission(done)) if submit else done)
        if f'"name": "{tool}"' in prompt:
            return think + qwen_tool_call(tool, **{argument: command, **extra})
        return think + "side request"

    return script


@pytest.mark.parametrize("kind", list(CLIS))
def test_a_cli_fixes_the_checkout_and_the_swe_reward_grades_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, tool, argument, extra = CLIS[kind]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    records = swe_data(tmp_path, monkeypatch)
    record = read_records(records, 1)[0]
    command = oracle_command(record.patch, "correct", None)
    if kind == "gemini_cli":
        # Gemini CLI refuses a command whose text holds backticks or $(...) ("Command injection
        # detected"), as this patch does: the model sends the patch base64-encoded instead.
        encoded = base64.b64encode(record.patch.encode()).decode()
        command = f"printf %s {encoded} | base64 -d | git apply -v"
    engine = ScriptedEngine(fixing_policy(tool, argument, extra, command, kind == "mini_swe_agent"))
    cfg = write_config(
        tmp_path,
        engine.url,
        dataset={"path": str(records), "limit": 1, "loader": "recipes.swe.loader:load_tasks"},
        n_samples_per_prompt=1,
        agent={"kind": kind},
        sampling={"max_tokens": 2048, "enable_thinking": None},
        sandbox={"network": False, "memory_mb": 2048, "max_processes": 256, "timeout_s": 240},
        reward={"kind": "python", "path": "recipes.swe.reward:score", "options": {"timeout_s": 120}},
        worker={"session_timeout_s": 400, "max_attempts": 1, "concurrency": 1},
    )
    db = f"sqlite:///{tmp_path / 'log.db'}"
    env = worker_env(tmp_path / "home", DRESSAGE_CACHE_DIR=str(tmp_path / "cache"))
    argv = [sys.executable, "-c", "from dressage.cli import main; main()", "rollout", "--no-progress"]
    with engine.running():
        proc = subprocess.run(
            [*argv, "--config", str(cfg), "--database-url", db],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=800,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = open_store(db, tmp_path / "home")
    try:
        (run,) = store.runs.list()
        (session,) = store.sessions.list(run)
        (reward,) = [e.payload for e in store.events.read(run, kinds=("reward",))]
    finally:
        store.close()
    details = reward["details"]
    assert session.status == "finished", session.error
    assert (reward["reward"], details["status"], details["integrity"]) == (1.0, "RESOLVED_FULL", "ok"), (
        details
    )
    assert details["model_patch"].startswith("diff --git a/csvlite/reader.py b/csvlite/reader.py")
