"""In-flight resume of a blackbox agent CLI: ``kill -9`` the worker mid-run, ``--resume`` continues.

Codex (OpenAI Responses dialect, a real CLI in a bwrap sandbox without network, as in
``test_native_clis_rollout.py``) calls the shell once, then answers from its output. The worker is
killed while the engine holds the answer request (the tool-call turn recorded). ``--resume``
restarts Codex in a fresh sandbox: its first request renders to the recorded turn's prompt, so the
proxy answers it from the log (no engine call), Codex runs the command again, and the answer is
generated live on the same session, appended to the same segment. (Claude Code resumes the same
way; checked by hand, left out here to keep the suite short.)
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest
import yaml

from tests.agents.test_native_clis import cli_in_usr
from tests.agents.test_native_clis_rollout import CASES, PROMPT
from tests.rollout.conftest import open_store, requires_bwrap, start_worker, write_config, write_tasks
from tests.scripted_engine import ScriptedEngine, qwen_tool_call

pytestmark = [requires_bwrap, pytest.mark.slow]


class _Policy:
    """Call the tool, then answer from its output; holds the first attempt's answer until released."""

    def __init__(self, tool: str, arguments: dict[str, str]) -> None:
        self.tool, self.arguments = tool, arguments
        self.phase = "first"
        self.calls: list[tuple[str, str]] = []
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, prompt: str, _n: int) -> str:
        responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt, re.DOTALL)
        if responses:
            step, body = "answer", "final answer: " + (responses[-1].strip().splitlines() or [""])[-1].strip()
        elif f'"name": "{self.tool}"' in prompt:
            step, body = "call", qwen_tool_call(self.tool, **self.arguments)
        else:
            step, body = "side", "side request"
        self.calls.append((self.phase, step))
        if self.phase == "first" and step == "answer":
            self.reached.set()
            self.release.wait(300)
        return ("The task needs one command.\n</think>\n\n" if prompt.endswith("<think>\n") else "") + body


@pytest.mark.timeout(900)
def test_codex_killed_mid_run_resumes_from_the_log(tmp_path: Path) -> None:
    binary, tool, arguments, _ = CASES["codex"]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    policy = _Policy(tool, arguments)
    with ScriptedEngine(policy).running() as eng:
        write_tasks(tmp_path / "tasks.jsonl", [{"prompt": PROMPT, "label": "tool-ran-ok"}])
        box = {
            "network": False,
            "memory_mb": 2048,
            "max_processes": 256,
            "timeout_s": 240,
            "max_timeout_s": 240,
        }
        cfg = write_config(
            tmp_path, eng.url, n_samples_per_prompt=1, agent={"kind": "codex"}, sandbox=box,
            sampling={"max_tokens": 1024, "enable_thinking": None},
            worker={"session_timeout_s": 240, "max_attempts": 3, "concurrency": 1, "lease_s": 3},
        )  # fmt: skip
        db, home = f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home"
        name = yaml.safe_load(cfg.read_text())["run"]
        proc = start_worker(["--config", str(cfg), "--database-url", db], home)
        try:
            assert policy.reached.wait(300), proc.communicate(timeout=60)[0].decode(errors="replace")[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)  # the worker, its proxy and the CLI's sandbox
            proc.wait(timeout=30)
        finally:
            policy.phase = "resume"
            policy.release.set()
        resumed = start_worker(["--resume", name, "--database-url", db], home)
        out = resumed.communicate(timeout=600)[0].decode(errors="replace")
        assert resumed.returncode == 0, out[-3000:]
    assert ("first", "call") in policy.calls
    assert [c for c in policy.calls if c[0] == "resume"] == [("resume", "answer")]  # the call: replayed
    store = open_store(db, home)
    try:
        (session,) = store.sessions.list(name)
        assert session.status == "finished" and session.reward == 1.0 and session.attempt == 2
        assert session.info["replay"]["outcome"] == "completed"
        assert session.info["replay"]["turns_replayed"] == 1
        turns = store.turns.read(session_id=session.id, with_experts=False)
        assert [(t.turn_index, t.segment_index, t.route) for t in turns] == [
            (0, 0, "create"),
            (1, 0, "append"),
        ]
    finally:
        store.close()
