"""Canaries of every key format (tests/secret_corpus.py) stay redacted at rest.

One small rollout on SQLite with the blackbox agent, where a user's secrets can flow:

- **declared secrets**: one canary of each format is a variable of ``secrets.sandbox`` or
  ``secrets.agent`` (valued from the worker's environment); the agent prints every one;
- **undeclared secrets**: another set, which the redaction list does not know (only the key formats
  can find them), reaches the sandbox base64-encoded in a task file; the agent decodes it onto
  stdout and stderr (a tool's output: the ``agent.log`` artifact, the answer), the reward command
  prints it (the reward's ``stdout_tail``/``stderr_tail``), and for one task the agent then crashes,
  so the stderr tail becomes the session's error (longer than the tail: it is cut after redaction);
- **the run config**: a canary in ``sandbox.env``, ``agent.env``, a command or an engine URL is
  refused before anything is created (:func:`test_a_canary_in_the_run_config_is_refused`).

Then every place at rest is searched, for each canary's value and for every 16-character piece of
it (a key cut in half must not leave its back half): a dump of every table plus the raw database
files, every file under the worker's home (artifact tarballs unpacked), the worker's log records
and console, and an ``export`` directory (each Parquet file read back row by row as text). 0 hits.

Out of scope, by design: what the agent writes into its own workspace (the workspace tarball is the
agent's work, kept as it is), the task rows of the dataset (the user's input; here they hold the
base64 form only) and the model's tokens (the log keeps them exactly: redaction never touches turns,
token ids or content hashes; it applies to errors, info, reward details, logs and ``agent.log``).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import logging
import random
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from dressage.config import Settings
from dressage.errors import ConfigError
from dressage.exports.export import export_run
from dressage.rollout.config import parse_config
from dressage.rollout.worker import WorkerOptions, run_rollout
from tests.rollout.conftest import open_store, requires_bwrap, write_config, write_tasks
from tests.rollout.test_canary import _database_dump
from tests.secret_corpus import FORMAT_TEMPLATES, fake_secrets

PIECE = 16


def _in_context(secrets: dict[str, str]) -> str:
    """Every secret in the text around it in real output (its label where the format needs one)."""
    return "\n".join(FORMAT_TEMPLATES.get(fmt, "using {} now").format(v) for fmt, v in secrets.items()) + "\n"


def _needles(secrets: dict[str, str]) -> dict[str, str]:
    """What must not be found at rest, by what it is: each value and its 16-character pieces
    (a PEM block: each line of its body)."""
    found = {}
    for fmt, value in secrets.items():
        found[value] = fmt
        parts = value.split("\n")[1:-1] if fmt.startswith("pem") else [value]
        for part in parts:
            for i in range(0, max(len(part) - PIECE, 0) + 1, PIECE // 2):
                found[part[i : i + PIECE]] = f"{fmt} piece"
    return found


def _unpacked(name: str, data: bytes) -> list[tuple[str, bytes]]:
    """``data`` and, for a gzip tarball, each member's content."""
    out = [(name, data)]
    if data[:2] == b"\x1f\x8b":
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is not None:
                    out.append((f"{name}:{member.name}", f.read()))
    return out


def _files(root: Path) -> list[tuple[str, bytes]]:
    """Every file under ``root``; Parquet files as the text of their rows."""
    out: list[tuple[str, bytes]] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".parquet":
            rows = pq.read_table(path).to_pylist()
            text = "\n".join(json.dumps(r, default=repr, ensure_ascii=False) for r in rows)
            assert rows or path.stat().st_size > 0
            out.append((f"{path} rows", text.encode()))
            for row in rows:  # binary cells (artifacts) as what they hold
                for key, cell in row.items():
                    if isinstance(cell, bytes):
                        out += _unpacked(f"{path}:{key}", cell)
        out += _unpacked(str(path), data)
    return out


AGENT = (
    'for v in $CANARY_NAMES; do echo "using $(printenv "$v") now"; echo "using $(printenv "$v") now" >&2; done; '
    "base64 -d leak.b64; base64 -d leak.b64 >&2; "
    'if [ -f fail ]; then echo "fatal: upstream refused the key" >&2; exit 3; fi'
)
REWARD = "base64 -d leak.b64; base64 -d leak.b64 >&2; test -f ok"


@requires_bwrap
@pytest.mark.anyio
async def test_canaries_of_every_format_stay_redacted_at_rest(
    tmp_path: Path,
    engine_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed = random.SystemRandom().randrange(2**32)
    declared = {f"CANARY_{fmt.upper()}": v for fmt, v in fake_secrets(seed).items()}
    undeclared = fake_secrets(seed + 1)
    for name, value in declared.items():
        monkeypatch.setenv(name, value)
    names = sorted(declared)
    leak = base64.b64encode(_in_context(undeclared).encode()).decode()
    rows = [
        {"prompt": "p", "label": "x", "files": {"leak.b64": leak}},
        {"prompt": "q", "files": {"leak.b64": leak, "fail": "1"}},
    ]
    write_tasks(tmp_path / "tasks.jsonl", rows)
    cfg = write_config(
        tmp_path,
        engine_url,
        n_samples_per_prompt=1,
        agent={"kind": "command", "command": AGENT, "env": {"CANARY_NAMES": " ".join(names)}},
        reward={"kind": "tests", "command": REWARD},
        secrets={"sandbox": names[::2], "agent": names[1::2]},
        worker={"max_attempts": 1},
    )
    home = tmp_path / "home"
    console_text = io.StringIO()
    caplog.set_level(logging.DEBUG)
    db_url = f"sqlite:///{tmp_path / 'log.db'}"
    report = await run_rollout(
        Settings(database_url=db_url, home=home),
        WorkerOptions(config_path=str(cfg), show_progress=True),
        Console(file=console_text, width=200),
    )

    store = open_store(db_url, home)
    run = store.runs.get(report.run)
    sessions = {s.status: s for s in store.sessions.list(run)}
    assert set(sessions) == {"finished", "failed"}, sessions
    error = sessions["failed"].error or ""
    assert "fatal: upstream refused the key" in error and "[REDACTED]" in error
    logs = [store.artifacts.get(a) for a in store.artifacts.list(run) if a.name == "agent.log"]
    assert len(logs) == 2
    for log in logs:  # every canary reached the agent and was printed, in its place a [REDACTED]
        assert log.count(b"using [REDACTED] now") >= 2 * len(declared)
        assert b"AccountName=fakeacct;AccountKey=[REDACTED];EndpointSuffix" in log
    manifest = export_run(store, run.name, tmp_path / "export")
    assert manifest["counts"]["events"] > 0
    store.close()

    places = [("database dump", _database_dump(db_url))]
    places += [("log records", "\n".join(r.getMessage() for r in caplog.records).encode())]
    places += [("worker console", console_text.getvalue().encode())]
    places += _files(home) + _files(tmp_path / "export")
    assert any("events.parquet rows" in where for where, _ in places)
    needles = _needles(undeclared) | _needles(dict(zip(fake_secrets(seed), declared.values(), strict=True)))
    hits = sorted(
        {
            (what, where)
            for needle, what in needles.items()
            for where, data in places
            if needle.encode() in data
        }
    )
    assert hits == [], f"{len(hits)} canaries at rest, e.g. {hits[:5]}"


CONFIG_PLACES = {
    "sandbox.env": lambda v: {"sandbox": {"provider": "bwrap", "env": {"TOOL_SETTING": v}}},
    "agent.env": lambda v: {"agent": {"kind": "command", "command": "true", "env": {"X": v}}},
    "agent.command": lambda v: {"agent": {"kind": "command", "command": f"run --flag {v}"}},
    "reward.command": lambda v: {"reward": {"kind": "tests", "command": f"check {v}"}},
}


@pytest.mark.parametrize("place", sorted(CONFIG_PLACES))
@pytest.mark.parametrize(("fmt", "value"), sorted(fake_secrets(seed=34).items()))
def test_a_canary_in_the_run_config_is_refused(place: str, fmt: str, value: str, tmp_path: Path) -> None:
    """The frozen config is stored with the run: a credential anywhere in it is a config error naming
    the field, before anything is created. Formats that need a label to be recognised get theirs."""
    text = FORMAT_TEMPLATES.get(fmt, "{}").format(value)
    base = {
        "run": "r",
        "dataset": {"path": "tasks.jsonl"},
        "engine": {"kind": "sglang", "urls": ["http://127.0.0.1:1"]},
    }
    with pytest.raises(ConfigError, match=rf"{place.split('.')[0]}\.[a-zA-Z_]+.*looks like a secret"):
        parse_config(base | CONFIG_PLACES[place](text), base_dir=tmp_path)


def test_an_engine_url_with_a_password_is_refused(tmp_path: Path) -> None:
    cfg = {
        "run": "r",
        "dataset": {"path": "tasks.jsonl"},
        "engine": {"kind": "sglang", "urls": ["http://user:hunter22@127.0.0.1:1"]},
    }
    with pytest.raises(ConfigError, match=r"engine\.urls\[0\]: the value holds what looks like a secret"):
        parse_config(cfg, base_dir=tmp_path)
