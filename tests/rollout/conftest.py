"""Helpers for rollout tests: configs and worker processes.

Workers point at the session's dev engine (``engine_url``, tests/conftest.py) as ``engine: {kind:
sglang, urls: [...]}`` (the dev engine speaks SGLang's protocol), so each test does not pay for
starting torch. The databases are ``any_db_url`` and ``rollout_pg_url`` (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from dressage.config import Settings
from dressage.store import EventStore
from tests.paddock.conftest import bwrap_unavailable_reason, requires_bwrap

__all__ = ["bwrap_unavailable_reason", "requires_bwrap"]

REPO = Path(__file__).resolve().parents[2]


def open_store(url: str, home: Path) -> EventStore:
    """An event store on ``url`` with artifacts under ``home``."""
    return EventStore.open(settings=Settings(database_url=url, home=home))


def write_tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write JSONL task rows."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(tmp: Path, engine_url: str, *, name: str | None = None, **sections: Any) -> Path:
    """A run.yaml pointing at the shared engine; ``sections`` override defaults."""
    cfg: dict[str, Any] = {
        "run": name or f"run-{uuid.uuid4().hex[:8]}",
        "dataset": {"path": "tasks.jsonl"},
        "n_samples_per_prompt": 2,
        "engine": {"kind": "sglang", "urls": [engine_url]},
        "sampling": {"max_tokens": 8, "enable_thinking": False},
        "agent": {"kind": "answer"},
        "sandbox": {"provider": "bwrap", "timeout_s": 20, "memory_mb": 512, "max_processes": 64},
        "reward": {"kind": "contains"},
        "worker": {
            "concurrency": 4,
            "lease_s": 30,
            "max_attempts": 2,
            "session_timeout_s": 60,
            "poll_s": 0.2,
        },
    }
    for k, v in sections.items():
        cfg[k] = (
            {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) and k != "agent" else v
        )
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def worker_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment of a worker subprocess: repo on PYTHONPATH (test agents), its own home."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRESSAGE_HOME": str(home), **extra}
    env.pop("DRESSAGE_DATABASE_URL", None)
    return env


def start_worker(args: list[str], home: Path, **extra: str) -> subprocess.Popen[bytes]:
    """``dressage-worker rollout ARGS`` as a real child process (its own process group)."""
    return start_command(["rollout", "--no-progress", *args], home, **extra)


def _ignore_sigint() -> None:
    """In the child: SIGINT ignored, as a shell script's background job inherits it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_command(
    argv: list[str], home: Path, *, sigint_ignored: bool = False, **extra: str
) -> subprocess.Popen[bytes]:
    """``dressage-worker ARGV`` as a real child process, the leader of its own process group (a test
    signals the group as a terminal would); ``sigint_ignored``: it inherits SIGINT as ignored."""
    return subprocess.Popen(
        [sys.executable, "-c", "from dressage.cli import main; main()", *argv],
        cwd=str(home.parent),
        env=worker_env(home, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
