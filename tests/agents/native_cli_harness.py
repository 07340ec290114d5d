"""The set-up the real-CLI worker tests share (``test_native_clis_resume.py``, ``..._fork.py``).

One task (:data:`PROMPT`), one sample, a real agent CLI in a bwrap sandbox without network behind
a scripted engine whose policy (a :class:`ToolThenAnswer`) calls the shell once, then answers from
the command's output; the run logs to SQLite under the test's ``tmp_path``.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.agents.test_native_clis import cli_in_usr, command_output, mini_submission
from tests.agents.test_native_clis_rollout import CASES, PROMPT
from tests.rollout.conftest import write_config, write_tasks
from tests.scripted_engine import qwen_tool_call

TIMEOUT_S = 240
SANDBOX = {
    "network": False,
    "memory_mb": 2048,
    "max_processes": 256,
    "timeout_s": TIMEOUT_S,
    "max_timeout_s": TIMEOUT_S,
}


def require_cli(kind: str) -> tuple[str, dict[str, str], str]:
    """(tool, arguments, dialect) of agent ``kind`` (a key of ``CASES``); skips without its CLI."""
    binary, tool, arguments, dialect = CASES[kind]
    if cli_in_usr(binary):
        pytest.skip(str(cli_in_usr(binary)))
    return tool, arguments, dialect


class ToolThenAnswer:
    """A scripted engine's policy: call ``tool`` while no tool response is in the prompt and the tool
    is offered, then answer with the last line of the last response; ``side request`` otherwise.

    Subclasses' ``__call__`` use :meth:`step` and :meth:`reply`; ``phase`` tags their ``calls``.
    """

    def __init__(self, tool: str, arguments: dict[str, str], phase: str) -> None:
        self.tool, self.arguments = tool, arguments
        self.phase = phase
        self.submit = False
        """Answer as a mini-swe-agent submission (a call of ``tool``), not as text."""
        self.lock = threading.Lock()

    def step(self, prompt: str, answer_prefix: str = "") -> tuple[str, str]:
        """(step, body): ``answer`` (``answer_prefix`` + ``final answer: <last line>``), ``call``
        (the tool call) or ``side``."""
        responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt, re.DOTALL)
        if responses:
            answer = f"{answer_prefix}final answer: {command_output(responses[-1])}"
            return "answer", qwen_tool_call(self.tool, **mini_submission(answer)) if self.submit else answer
        if f'"name": "{self.tool}"' in prompt:
            return "call", qwen_tool_call(self.tool, **self.arguments)
        return "side", "side request"

    @staticmethod
    def reply(prompt: str, body: str) -> str:
        """``body``, after a short reasoning block when the prompt ends in an open ``<think>``."""
        return ("The task needs one command.\n</think>\n\n" if prompt.endswith("<think>\n") else "") + body


class CliRun(NamedTuple):
    """A run's config file, its SQLite log, the worker's home and the run's name."""

    config: Path
    db: str
    home: Path
    name: str


def cli_run(tmp_path: Path, engine_url: str, kind: str, **worker: Any) -> CliRun:
    """Write the task and run.yaml for agent ``kind`` (``worker`` on top of a 240 s session timeout)."""
    write_tasks(tmp_path / "tasks.jsonl", [{"prompt": PROMPT, "label": "tool-ran-ok"}])
    cfg = write_config(
        tmp_path,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": kind},
        sandbox=SANDBOX,
        sampling={"max_tokens": 1024, "enable_thinking": None},
        worker={"session_timeout_s": TIMEOUT_S, **worker},
    )
    name = yaml.safe_load(cfg.read_text())["run"]
    return CliRun(cfg, f"sqlite:///{tmp_path / 'log.db'}", tmp_path / "home", name)
