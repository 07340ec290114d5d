"""``dressage-worker train --follow`` stops gracefully: on SIGINT to its process group (inherited as
ignored, as a script's background job does) and on ``dressage-worker stop RUN``, it exits 130 / 143
and says how to go on (``train`` continues after its consumer's last committed step)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.rollout.stop_requests import request_stop
from dressage.store import EventStore
from tests.rollout.conftest import start_command

pytestmark = pytest.mark.slow


def _following(tmp: Path, url: str, *, sigint_ignored: bool) -> subprocess.Popen[bytes]:
    """``train --follow`` on an empty run ``r`` (nothing to train: it polls the log)."""
    args = ["train", "--from-run", "r", "--follow", "--backend", "none", "--n-samples-per-prompt", "2"]
    proc = start_command([*args, "--database-url", url], tmp / "home", sigint_ignored=sigint_ignored)
    # it has opened the log (so its handlers are set, and its stop watch will start) once a file
    # descriptor points at log.db: wait for that, not for a guessed time
    deadline = time.monotonic() + 120
    while not _has_open(proc.pid, tmp / "log.db"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0].decode()
        time.sleep(0.1)
    return proc


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (Linux ``/proc``)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("how", ["SIGINT", "stop"])
def test_train_follow_stops_gracefully(tmp_path: Path, how: str) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    (tmp_path / "home").mkdir()
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path / "home"))
    try:
        store.runs.create("r")
        proc = _following(tmp_path, url, sigint_ignored=how == "SIGINT")
        if how == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)
        else:  # a request written before its stop watch started is history to it: ask until it stops
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                request_stop(store, "r")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=3)
        out = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        store.close()
    assert proc.returncode == (130 if how == "SIGINT" else 143), out
    assert "0 new steps committed for train:main" in out
    assert "interrupted: resume with dressage-worker train --from-run r --consumer main" in out
