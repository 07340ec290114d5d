"""A multi-turn coding run killed with ``kill -9`` halfway, then resumed: shared by the test and the bench.

:class:`CodingScript` is a scripted engine's policy: step ``k`` (= the number of tool results in the
prompt) writes a module, runs it, writes its test, runs that, ...; then answers. It counts every
engine request by phase and step, and can hold the request of one step until released, so the
worker is killed while it waits on the engine (its earlier turns recorded, that one not).

:func:`crash_and_resume` runs a real ``dressage-worker rollout`` process (coding agent, bwrap
sandbox), kills it with SIGKILL once it waits on step ``hold_at``, then runs ``--resume``, and
returns what the engine generated after the resume and the trajectory of the resumed session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dressage.store import EventStore
from dressage.tito import get_profile
from tests.rollout.conftest import open_store, start_worker, write_config, write_tasks
from tests.scripted_engine import qwen_tool_call

PLAN: list[tuple[str, dict[str, Any]]] = [
    ("file_write", {"path": "fib.py", "content": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"}),
    ("shell_exec", {"cmd": "python3 -c 'import fib; print(fib.fib(10))'"}),
    ("file_write", {"path": "test_fib.py", "content": "import fib\nassert fib.fib(12) == 144\nprint('ok')\n"}),
    ("shell_exec", {"cmd": "python3 test_fib.py"}),
    ("file_read", {"path": "fib.py"}),
    ("shell_exec", {"cmd": "ls"}),
]  # fmt: skip
"""The tool call of each step; their outputs depend on what earlier steps did in the sandbox."""
ANSWER = "fib is written and its test prints ok."
TASKS = [{"prompt": "Write fib.py with a recursive fib(n) and a test for it.", "label": "ok"}]


def reply_for(step: int) -> str:
    """The assistant text of step ``step``."""
    if step < len(PLAN):
        name, args = PLAN[step]
        return qwen_tool_call(name, **args)
    return ANSWER


@dataclass
class CodingScript:
    """The scripted engine's policy; see the module docstring. Thread-safe (the engine's thread calls it)."""

    hold_at: int | None = None
    phase: str = "first"
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    """(phase, step, tokens generated) per engine request."""
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        step = prompt.count("<tool_response>")
        text = reply_for(step)
        n_tokens = len(get_profile("qwen3.5").tokenizer.encode(text)) + 1  # + the turn's end token
        self.calls.append((self.phase, step, n_tokens))
        if self.phase == "first" and step == self.hold_at:
            self.reached.set()
            self.release.wait(120)
        return text

    def generated(self, phase: str, below_step: int | None = None) -> tuple[int, int]:
        """(requests, tokens) the engine generated in ``phase``, for steps below ``below_step``."""
        rows = [c for c in self.calls if c[0] == phase and (below_step is None or c[1] < below_step)]
        return len(rows), sum(c[2] for c in rows)


def run_config(tmp: Path, engine_url: str, *, resume: bool, sandbox: Mapping[str, Any] | None = None) -> Path:
    """run.yaml for one coding task, one sample, a seed, 3 s leases (so ``--resume`` reclaims soon);
    ``sandbox`` goes over the default ``sandbox:`` section."""
    write_tasks(tmp / "tasks.jsonl", TASKS)
    return write_config(
        tmp,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "coding", "max_turns": len(PLAN) + 2},
        sampling={"max_tokens": 256, "enable_thinking": False, "seed": 1},
        reward={"kind": "contains"},
        worker={"concurrency": 1, "lease_s": 3, "max_attempts": 3, "resume_in_flight": resume},
        **({"sandbox": dict(sandbox)} if sandbox else {}),
    )


def _finish(proc: subprocess.Popen[bytes], timeout: float = 180) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"worker exited {proc.returncode}:\n{text[-3000:]}")
    return text


def trajectory(store: EventStore, session_id: str) -> list[tuple[Any, ...]]:
    """The session's turns as comparable tuples: placement and every per-token array."""
    out = []
    for t in store.turns.read(session_id=session_id, with_experts=False):
        head = (t.turn_index, t.segment_index, t.segment_offset, t.route, t.thread_index, t.boundary_reason)
        arrays = (t.context_ids, t.generated_ids, t.logprobs, t.policy_versions, t.loss_mask)
        out.append((*head, *(a.tolist() for a in arrays)))
    return out


def uninterrupted(
    tmp: Path,
    db_url: str,
    engine_url: str,
    *,
    sandbox: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[tuple[Any, ...]]:
    """Run the task to the end in one worker; the finished session's trajectory (``sandbox``: as in
    :func:`run_config`; ``env``: more environment for the worker)."""
    tmp.mkdir(parents=True, exist_ok=True)
    home = tmp / "home"
    cfg = run_config(tmp, engine_url, resume=True, sandbox=sandbox)
    _finish(start_worker(["--config", str(cfg), "--database-url", db_url], home, **(env or {})))
    store = open_store(db_url, home)
    try:
        name = yaml.safe_load(cfg.read_text())["run"]
        (session,) = store.sessions.list(name, status="finished")
        return trajectory(store, session.id)
    finally:
        store.close()


@dataclass
class Resumed:
    """What :func:`crash_and_resume` observed."""

    recorded_at_kill: int
    """Turns the killed worker had recorded."""
    prefix_requests: int
    prefix_tokens: int
    """Engine requests / tokens after the resume for the steps already recorded before the kill."""
    live_requests: int
    sessions: list[Any]
    trajectory: list[tuple[Any, ...]]
    events: list[Any]


def crash_and_resume(
    tmp: Path,
    db_url: str,
    script: CodingScript,
    engine_url: str,
    *,
    resume: bool = True,
    sandbox: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Resumed:
    """Start a worker, ``kill -9`` it while it waits on step ``script.hold_at``, run ``--resume``
    (``sandbox``, ``env``: as in :func:`uninterrupted`)."""
    assert script.hold_at is not None
    tmp.mkdir(parents=True, exist_ok=True)
    home = tmp / "home"
    extra = dict(env or {})
    cfg = run_config(tmp, engine_url, resume=resume, sandbox=sandbox)
    name = yaml.safe_load(cfg.read_text())["run"]
    script.phase = "first"
    proc = start_worker(["--config", str(cfg), "--database-url", db_url], home, **extra)
    try:
        if not script.reached.wait(120):
            proc.kill()
            raise AssertionError(f"the worker never reached step {script.hold_at}:\n{_finish(proc)}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        script.phase = "resume"
        script.release.set()
    store = open_store(db_url, home)
    try:
        (running,) = store.sessions.list(name, status="running")
        recorded = len(store.turns.read(session_id=running.id, with_experts=False))
        time.sleep(0.1)
        _finish(start_worker(["--resume", name, "--database-url", db_url], home, **extra))
        prefix = script.generated("resume", below_step=recorded)
        live = script.generated("resume")[0] - prefix[0]
        sessions = store.sessions.list(name)
        (finished,) = [s for s in sessions if s.status == "finished"]
        events = store.events.read(name, kinds=("session_resumed", "session_finalized"))
        return Resumed(recorded, prefix[0], prefix[1], live, sessions, trajectory(store, finished.id), events)
    finally:
        store.close()
