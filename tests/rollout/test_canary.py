"""Canary: secrets given to a run never come to rest (findings F7-F9 of the attack run).

Two canary values reach a rollout the supported way (``secrets: {sandbox: [...], agent: [...]}``,
valued from the worker's environment); the blackbox agent prints both on stdout and stderr and,
for one task, fails with them in its error. After the run, a full dump of the database
(``pg_dump`` / SQLite's ``iterdump`` plus the raw database files), every log record, the worker's
console and every artifact (the workspace tarballs unpacked) hold 0 occurrences. The values did
reach the sandbox: the agent log shows ``[REDACTED]`` where the agent printed them, and the
run's snapshot holds the names and digests.

Not covered here (proxy side, tested with the proxy's own suite): secrets in HTTP headers and in
engine error bodies.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import sqlite3
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from dressage.config import Settings
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.conftest import create_pg_database
from tests.rollout.conftest import open_store, requires_bwrap, write_config, write_tasks

pytestmark = [requires_bwrap, pytest.mark.anyio]

AGENT = (
    'echo "stdout $CANARY_SANDBOX $CANARY_AGENT"; echo "stderr $CANARY_AGENT $CANARY_SANDBOX" >&2; '
    'if [ -f fail ]; then echo "fatal: upstream refused key $CANARY_AGENT" >&2; exit 3; fi'
)


def _database_dump(db_url: str) -> bytes:
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///") :])
        with sqlite3.connect(path) as conn:
            dump = "\n".join(conn.iterdump()).encode()
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        return dump + raw
    uri = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    out = subprocess.run(["pg_dump", "--dbname", uri], capture_output=True, check=True, timeout=120)
    return out.stdout


def _artifact_bytes(home: Path) -> list[tuple[str, bytes]]:
    found = []
    for path in (home / "artifacts").rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        found.append((str(path), data))
        if data[:2] == b"\x1f\x8b":  # a workspace tarball: look inside too
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
                for member in tar.getmembers():
                    f = tar.extractfile(member)
                    if f is not None:
                        found.append((f"{path}:{member.name}", f.read()))
    return found


@pytest.fixture(params=["sqlite", "postgresql"])
def canary_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return create_pg_database(f"dressage_canary_{os.getpid()}")
    return f"sqlite:///{tmp_path / 'log.db'}"


async def test_declared_secrets_reach_the_agent_and_never_come_to_rest(
    tmp_path: Path,
    engine_url: str,
    canary_db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    canaries = {
        "CANARY_SANDBOX": f"cnry-sbx-{uuid.uuid4().hex}",
        "CANARY_AGENT": f"cnry-agt-{uuid.uuid4().hex}",
    }
    for name, value in canaries.items():
        monkeypatch.setenv(name, value)
    write_tasks(
        tmp_path / "tasks.jsonl", [{"prompt": "p", "label": "x"}, {"prompt": "q", "files": {"fail": "1"}}]
    )
    cfg = write_config(
        tmp_path,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "command", "command": AGENT},
        secrets={"sandbox": ["CANARY_SANDBOX"], "agent": ["CANARY_AGENT"]},
        worker={"max_attempts": 1},
    )
    home = tmp_path / "home"
    console_text = io.StringIO()
    caplog.set_level(logging.DEBUG)
    report = await run_rollout(
        Settings(database_url=canary_db_url, home=home),
        WorkerOptions(config_path=str(cfg), show_progress=True),
        Console(file=console_text, width=200),
    )

    store = open_store(canary_db_url, home)
    run = store.runs.get(report.run)
    sessions = {s.status: s for s in store.sessions.list(run)}
    assert set(sessions) == {"finished", "failed"}
    assert "fatal: upstream refused key [REDACTED]" in (sessions["failed"].error or "")
    assert run.config["rollout"]["secrets"] == {"sandbox": ["CANARY_SANDBOX"], "agent": ["CANARY_AGENT"]}
    assert set(run.config["secret_digests"]) == {"sandbox.CANARY_SANDBOX", "agent.CANARY_AGENT"}
    logs = [store.artifacts.get(a) for a in store.artifacts.list(run) if a.name == "agent.log"]
    assert len(logs) == 2 and all(b"stdout [REDACTED] [REDACTED]" in log for log in logs)
    store.close()

    places = [("database dump", _database_dump(canary_db_url))]
    places += [("log records", "\n".join(r.getMessage() for r in caplog.records).encode())]
    places += [("worker console", console_text.getvalue().encode())]
    places += _artifact_bytes(home)
    assert "[REDACTED]" in console_text.getvalue()  # the failure line was printed, redacted
    for value in canaries.values():
        hits = [where for where, data in places if value.encode() in data]
        assert hits == [], f"{value} found in {hits}"
