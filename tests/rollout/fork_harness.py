"""A 6-turn tool-loop session and its forks, with real ``dressage-worker`` processes.

:class:`ForkScript` is a scripted engine's policy: step ``k`` (= the tool results in the prompt)
runs one shell command that appends a line to ``log.txt``, writes ``f<k>.txt`` and prints the
sha256 of every file in the workspace, so the next turn's prompt carries the workspace's hashes.
From step :data:`SEED_STEP` on, the line names the request's sampling seed: branches with their
own seeds diverge there. Every engine request is counted by phase, step and seed.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dressage.store import EventStore
from tests.rollout.conftest import open_store, start_command, start_worker, write_config, write_tasks
from tests.scripted_engine import qwen_tool_call

TURNS = 6
SEED_STEP = 3
TASKS = [{"prompt": "Keep a log of six steps in log.txt and show the file hashes after each.", "label": "s5"}]


def command(step: int, seed: object) -> str:
    """The shell command of step ``step`` (seed-dependent from :data:`SEED_STEP` on)."""
    tag = "shared" if step < SEED_STEP else f"seed{seed}"
    return f"echo s{step}-{tag} >> log.txt && printf {step} > f{step}.txt && sha256sum log.txt f*.txt"


def log_hash_after(step: int) -> str:
    """sha256 of ``log.txt`` after the shared steps ``0..step`` (what the sandbox must print)."""
    text = "".join(f"s{k}-shared\n" for k in range(step + 1))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ForkScript:
    """The engine's policy (see the module docstring); thread-safe, reads the request's seed."""

    phase: str = "parent"
    hold: tuple[int, int] | None = None
    """(step, seed): hold that request until :attr:`release` is set (a worker to kill meanwhile)."""
    calls: list[tuple[str, int, object]] = field(default_factory=list)
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, prompt: str, n: int, sampling: Mapping[str, Any]) -> str:
        step = prompt.count("<tool_response>")
        seed = sampling.get("sampling_seed")
        self.calls.append((self.phase, step, seed))
        if self.hold == (step, seed) and not self.release.is_set():
            self.reached.set()
            self.release.wait(120)
        return qwen_tool_call("shell_exec", cmd=command(step, seed))

    def settle(self, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
        """Wait until no request has arrived for ``quiet_s``: requests a killed worker had already
        sent (queued behind a held one) are answered in the phase that is current meanwhile."""
        deadline, seen = time.monotonic() + limit_s, -1
        while time.monotonic() < deadline and seen != len(self.calls):
            seen = len(self.calls)
            time.sleep(quiet_s)

    def requests(self, phase: str) -> list[tuple[int, object]]:
        """(step, seed) of each engine request of ``phase``."""
        return [(step, seed) for p, step, seed in self.calls if p == phase]


def parent_config(tmp: Path, engine_url: str, **sections: Any) -> Path:
    """run.yaml: the coding agent for six turns, one task, one sample, a sampling seed.

    ``sections`` (e.g. ``branching=...``, ``worker=...``) replace this function's own sections of
    the same name and are passed on to :func:`write_config`.
    """
    write_tasks(tmp / "tasks.jsonl", TASKS)
    own: dict[str, Any] = {
        "n_samples_per_prompt": 1,
        "agent": {"kind": "coding", "max_turns": TURNS},
        "sampling": {"max_tokens": 256, "enable_thinking": False, "seed": 1},
        "reward": {"kind": "contains"},
        "worker": {"concurrency": 4, "lease_s": 30, "max_attempts": 2, "session_timeout_s": 120},
    }
    return write_config(tmp, engine_url, **{**own, **sections})


def finish(proc: subprocess.Popen[bytes], timeout: float = 240) -> str:
    """Wait for a worker process; its output (raises when it failed)."""
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"worker exited {proc.returncode}:\n{text[-4000:]}")
    return text


def record_parent(tmp: Path, db_url: str, engine_url: str) -> tuple[str, str]:
    """Run the 6-turn session to its end; (run name, session id)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = parent_config(tmp, engine_url)
    finish(start_worker(["--config", str(cfg), "--database-url", db_url], tmp / "home"))
    name = yaml.safe_load(cfg.read_text())["run"]
    store = open_store(db_url, tmp / "home")
    try:
        (session,) = store.sessions.list(name, status="finished")
        return name, session.id
    finally:
        store.close()


def start_fork(args: list[str], home: Path, *, sigint_ignored: bool = False) -> subprocess.Popen[bytes]:
    """``dressage-worker fork ARGS`` as a real child process (its own process group)."""
    return start_command(["fork", *args], home, sigint_ignored=sigint_ignored)


def turn_rows(store: EventStore, session_id: str) -> list[tuple[Any, ...]]:
    """A session's turns as comparable tuples: placement and every per-token array."""
    out = []
    for t in store.turns.read(session_id=session_id, with_experts=False):
        head = (t.turn_index, t.segment_index, t.segment_offset, t.route, t.thread_index, t.boundary_reason)
        arrays = (t.context_ids, t.generated_ids, t.logprobs, t.loss_mask, t.policy_versions)
        out.append((*head, *(a.tolist() for a in arrays)))
    return out
