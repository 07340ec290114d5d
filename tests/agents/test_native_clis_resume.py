"""In-flight resume of a blackbox agent CLI: ``kill -9`` the worker mid-run, ``--resume`` continues.

Codex (OpenAI Responses dialect), Qwen Code and mini-swe-agent (chat completions), real CLIs in a bwrap sandbox
without network, as in ``test_native_clis_rollout.py``, call the shell once, then answers from its output. The worker is
killed while the engine holds the answer request (the tool-call turn recorded). ``--resume``
restarts the CLI in a fresh sandbox: its first request renders to the recorded turn's prompt, so the
proxy answers it from the log (no engine call), the CLI runs the command again, and the answer is
generated live on the same session, appended to the same segment. (Claude Code resumes the same
way; checked by hand, left out here to keep the suite short.)
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.agents.native_cli_harness import ToolThenAnswer, cli_run, require_cli
from tests.agents.test_native_clis_rollout import SUBMITS
from tests.rollout.conftest import open_store, requires_bwrap, start_worker
from tests.scripted_engine import ScriptedEngine

pytestmark = [requires_bwrap, pytest.mark.slow]


class _Policy(ToolThenAnswer):
    """Call the tool, then answer from its output; holds the first attempt's answer until released."""

    def __init__(self, tool: str, arguments: dict[str, str]) -> None:
        super().__init__(tool, arguments, "first")
        self.calls: list[tuple[str, str]] = []
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, prompt: str, _n: int, _sampling: Mapping[str, Any]) -> str:
        step, body = self.step(prompt)
        self.calls.append((self.phase, step))
        if self.phase == "first" and step == "answer":
            self.reached.set()
            self.release.wait(300)
        return self.reply(prompt, body)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["codex", "qwen_code", "mini_swe_agent", "gemini_cli"])
def test_cli_killed_mid_run_resumes_from_the_log(tmp_path: Path, kind: str) -> None:
    tool, arguments, _ = require_cli(kind)
    policy = _Policy(tool, arguments)
    policy.submit = kind in SUBMITS
    with ScriptedEngine(policy).running() as eng:
        cfg, db, home, name = cli_run(tmp_path, eng.url, kind, max_attempts=3, concurrency=1, lease_s=3)
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
