"""The database server itself crashes mid-append: a private PostgreSQL cluster, stopped ``-m immediate``.

The test makes its own cluster (initdb into a temporary directory, its own port and socket, run as
the ``postgres`` user as PostgreSQL requires), lets two writer processes append turns, stops the
server with ``pg_ctl stop -m immediate`` (no shutdown checkpoint: recovery replays the WAL), starts
it again, resumes the writers after their last acknowledged turn, and checks that every acknowledged
append is present exactly once with its position and content hash, and that positions are dense.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dressage.config import Settings
from dressage.store import EventStore
from dressage.store.db import upgrade
from dressage.store.records import prepare_turn
from tests.store.test_concurrency import _acks, _collect, _spawn
from tests.store.writer_proc import make_turn


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _skip_reason() -> str | None:
    if _pg_bin() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no 'postgres' user to run a private cluster as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "a private cluster needs root (to run as postgres) or the postgres user"
    return None


class Cluster:
    """A throwaway PostgreSQL cluster on a free loopback port."""

    def __init__(self, root: Path) -> None:
        self.bin = _pg_bin()
        self.data, self.sock, self.log = root / "data", root / "sock", root / "server.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self.sock.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.data.parent, "postgres")
            shutil.chown(self.sock, "postgres")
        self._as_postgres("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on"
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")

    def crash(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "stop")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="dressage-pg-"))
    c = Cluster(root)
    try:
        c.init()
        c.start()
        upgrade(c.url)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres
def test_server_crash_mid_append_loses_and_doubles_nothing(cluster: Cluster) -> None:
    run = "crash"
    writers = ["crash-w0", "crash-w1"]
    acked: dict[str, tuple[int, str]] = {}
    progress = dict.fromkeys(writers, 0)
    for round_ in range(2):
        procs = {w: _spawn(cluster.url, run, w, progress[w], 5000, 0) for w in writers}
        lines = {w: _collect(p) for w, p in procs.items()}
        deadline = time.monotonic() + 120
        while min(len(x) for x in lines.values()) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.crash()  # mid-append: the writers are in the middle of their loops
        for w, p in procs.items():
            p.wait(timeout=120)
            assert p.returncode != 0, "a writer cannot finish 5000 appends against a stopped server"
            rows = _acks("\n".join(lines[w]))
            assert rows, f"round {round_}: writer {w} acknowledged nothing before the crash"
            for _kind, i, pos, key in rows:
                acked[key] = (pos, prepare_turn(run, make_turn(w, i)).content_hash)
            progress[w] = rows[-1][1] + 1  # the next turn may or may not have committed
        cluster.start()
    store = EventStore.open(settings=Settings(database_url=cluster.url), auto_upgrade=False)
    try:
        events = store.events.read(run, limit=100_000)
    finally:
        store.close()
    positions = [e.position for e in events]
    assert positions == list(range(1, len(events) + 1)), "a hole in positions is a bug"
    keys = [e.key for e in events]
    assert len(keys) == len(set(keys)), "no append is present twice"
    by_key = {e.key: e for e in events}
    for key, (pos, content_hash) in acked.items():
        assert key in by_key, f"acknowledged append {key} was lost in the crash"
        assert (by_key[key].position, by_key[key].content_hash) == (pos, content_hash)
    assert len(acked) >= 60
