"""Several writer processes, one run, a concurrent tailer; and kill -9 at random points.

Checks the log's guarantees with real processes on both backends: positions dense, nothing missed,
nothing twice, reader order = position order, every acknowledged append present exactly once with
its content hash.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dressage.store import EventStore
from dressage.store.records import prepare_turn
from tests.store.writer_proc import make_turn

WRITER = str(Path(__file__).with_name("writer_proc.py"))
ROOT = str(Path(__file__).resolve().parents[2])


def _spawn(
    url: str, run: str, session: str, start: int, count: int, resend_every: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WRITER, url, run, session, str(start), str(count), str(resend_every)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
    )


class _Lines(list[str]):
    """A writer's stdout lines, appended by a background reader; :meth:`drained` waits for its end."""

    reader: threading.Thread

    def drained(self) -> _Lines:
        self.reader.join(timeout=60)
        assert not self.reader.is_alive(), "the writer's stdout was not closed"
        return self


def _collect(proc: subprocess.Popen[str]) -> _Lines:
    """Read a writer's stdout lines in the background as they are printed."""
    lines = _Lines()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                lines.append(line.strip())

    lines.reader = threading.Thread(target=pump, daemon=True)
    lines.reader.start()
    return lines


def _acks(out: str) -> list[tuple[str, int, int, str]]:
    rows = []
    for line in out.splitlines():
        kind, i, pos, key = line.split()
        rows.append((kind, int(i), int(pos), key))
    return rows


def test_writers_and_tailer(store: EventStore, db_url: str, run_name: str) -> None:
    store.runs.create(run_name)
    n_writers, per_writer = 4, 40
    seen: list[int] = []
    done = threading.Event()

    def tail() -> None:
        after = 0
        while True:
            finished = done.is_set()
            for ev in store.events.read(run_name, after=after, limit=500):
                seen.append(ev.position)
                after = ev.position
            if finished:
                return
            time.sleep(0.01)

    reader = threading.Thread(target=tail)
    reader.start()
    procs = [_spawn(db_url, run_name, f"{run_name}-w{k}", 0, per_writer, 5) for k in range(n_writers)]
    outputs = [p.communicate(timeout=240) for p in procs]
    done.set()
    reader.join(timeout=60)
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err

    last = store.events.last_position(run_name)
    # run_created + per writer: session_started + its turns
    assert last == 1 + n_writers * (1 + per_writer)
    assert seen == list(range(1, last + 1)), "the tailer must see every position once, in order"
    events = store.events.read(run_name, limit=10_000)
    assert [e.position for e in events] == list(range(1, last + 1))
    by_key = {e.key: e for e in events}
    for k, (out, _) in enumerate(outputs):
        for kind, i, pos, key in _acks(out):
            ev = by_key[key]
            assert ev.position == pos, (kind, i)
            assert ev.content_hash == prepare_turn(run_name, make_turn(f"{run_name}-w{k}", i)).content_hash


@pytest.mark.parametrize("seed", [1])
def test_kill9_keeps_every_acknowledged_append(
    store: EventStore, db_url: str, run_name: str, seed: int
) -> None:
    store.runs.create(run_name)
    rnd = random.Random(seed)
    acked: dict[str, tuple[int, str]] = {}
    progress = {f"{run_name}-w0": 0, f"{run_name}-w1": 0}
    for _round in range(4):
        procs = {w: _spawn(db_url, run_name, w, progress[w], 2000, 0) for w in progress}
        lines = {w: _collect(p) for w, p in procs.items()}
        deadline = time.time() + 120
        while not all(lines.values()) and time.time() < deadline:
            time.sleep(0.05)  # wait until both writers are appending
            for p in procs.values():
                if p.poll() is not None:
                    pytest.fail(f"a writer exited early: {p.stderr.read() if p.stderr else ''}")
        time.sleep(rnd.uniform(0.1, 1.0))
        for p in procs.values():
            p.kill()  # SIGKILL at a random point, possibly mid-transaction
        for w, p in procs.items():
            p.wait(timeout=60)
            rows = _acks("\n".join(lines[w].drained()))
            for _kind, i, pos, key in rows:
                acked[key] = (pos, prepare_turn(run_name, make_turn(w, i)).content_hash)
            # restart after the last acknowledged turn; an unacknowledged one may or may not be in the log
            if rows:
                progress[w] = rows[-1][1] + 1
    assert len(acked) > 10, "the writers should have acknowledged appends before being killed"
    events = store.events.read(run_name, limit=100_000)
    positions = [e.position for e in events]
    assert positions == list(range(1, len(events) + 1)), "a hole in positions is a bug"
    keys = [e.key for e in events]
    assert len(keys) == len(set(keys)), "no append is present twice"
    by_key = {e.key: e for e in events}
    for key, (pos, content_hash) in acked.items():
        assert key in by_key, f"acknowledged append {key} was lost"
        assert by_key[key].position == pos and by_key[key].content_hash == content_hash
    turns = store.turns.read(run_name)
    assert len(turns) == len([e for e in events if e.kind == "turn"])
