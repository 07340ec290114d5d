"""The quickstart's recommended offline command, as a user runs it: `dressage-worker train --from-run
quickstart` after `dressage-worker rollout --config examples/quickstart.yaml` trains tokens in every
step it commits (the recorded data is all policy version 0: staleness is measured against the data's
own versions), and so does `train --from-export` of the same run. Measured against the trainer's
version instead, the third step would train nothing: it is refused in one line, or skipped and said."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dressage.store import EventStore
from tests.rollout.conftest import REPO, open_store, requires_bwrap, worker_env

pytestmark = [requires_bwrap, pytest.mark.slow, pytest.mark.timeout(1200)]  # the torch steps: minutes


@dataclass
class Quickstart:
    cwd: Path
    url: str

    def worker(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``dressage-worker ARGS`` in the quickstart's directory (its ./.dressage log)."""
        return subprocess.run(
            [sys.executable, "-c", "from dressage.cli import main; main()", *args],
            cwd=self.cwd,
            env={**worker_env(self.cwd / ".dressage"), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=600,
        )

    def store(self) -> EventStore:
        return open_store(self.url, self.cwd / ".dressage")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quickstart]:
    """The README's quickstart rollout, recorded once for the module."""
    cwd = tmp_path_factory.mktemp("quickstart")
    q = Quickstart(cwd, f"sqlite:///{cwd / '.dressage' / 'dressage.db'}")
    done = q.worker("rollout", "--no-progress", "--config", str(REPO / "examples" / "quickstart.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    yield q


def trained_tokens(store: EventStore, run: str, consumer: str) -> list[float]:
    """``trained_tokens`` of each committed step of ``consumer``, in step order."""
    metrics = store.consumers.metrics(run, consumer)
    return [metrics[step]["trained_tokens"] for step in sorted(metrics)]


def test_the_recommended_train_trains_tokens_in_every_step(quickstart: Quickstart) -> None:
    done = quickstart.worker("train", "--from-run", "quickstart")
    assert done.returncode == 0, done.stderr[-3000:]
    store = quickstart.store()
    try:
        tokens = trained_tokens(store, "quickstart", "train:main")
        steps = store.consumers.steps("quickstart", "train:main")
    finally:
        store.close()
    assert len(tokens) == 6 and all(n > 0 for n in tokens), tokens  # 12 tasks x 4 in steps of 8
    assert all(s.manifest["options"]["masking"]["staleness_reference"] == "data" for s in steps)
    total = int(sum(tokens))
    assert f"6 new steps committed for train:main ({total} tokens trained; staleness against the data's" in (
        done.stderr
    )
    assert "warning" not in done.stderr


def test_train_from_an_export_trains_every_step(quickstart: Quickstart) -> None:
    exported = quickstart.worker("export", "quickstart", "--to", str(quickstart.cwd / "export"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    other = f"sqlite:///{quickstart.cwd / 'other.db'}"  # session ids are unique per log: another one
    assert quickstart.worker("db", "upgrade", "--database-url", other).returncode == 0
    done = quickstart.worker(
        "train", "--from-export", str(quickstart.cwd / "export"), "--backend", "none", "--database-url", other
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = open_store(other, quickstart.cwd / ".dressage")
    try:
        [name] = [r.name for r in store.runs.list() if r.name.startswith("quickstart@export-")]
        tokens = trained_tokens(store, name, "train:main")
    finally:
        store.close()
    assert len(tokens) == 6 and all(n > 0 for n in tokens), tokens


def test_against_the_trainer_s_version_an_empty_step_is_refused_in_one_line(quickstart: Quickstart) -> None:
    args = ["train", "--from-run", "quickstart", "--backend", "none", "--staleness-reference", "trainer"]
    done = quickstart.worker(*args, "--consumer", "strict")
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: step 3 would train 0 tokens: its ") and "(stale " in line
    assert "trainer version 2 with max_staleness 1" in line and "stopped after 2 committed step(s)" in line
    skipped = quickstart.worker(*args, "--consumer", "skipper", "--empty-steps", "skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert "2 new steps committed for train:skipper" in skipped.stderr
    # which tasks: the order their groups became ready in this rollout
    assert re.search(
        r"warning: skipped 8 group\(s\) \(tasks [\d, ]+\) whose steps would train 0 tokens", skipped.stderr
    )
    store = quickstart.store()
    try:
        assert trained_tokens(store, "quickstart", "train:strict") == trained_tokens(
            store, "quickstart", "train:skipper"
        )
    finally:
        store.close()
