"""Read replicas: the trainer and the viewer read from a PostgreSQL streaming replica.

The test makes a private primary cluster and a hot standby of it (``pg_basebackup -R``: streaming
replication on loopback), records a rollout into the primary, and checks that the trainer forms
byte-identical batches from the replica (same batch hashes and manifests as from the primary),
that it waits for a lagging replica (replay paused: a clear error after the timeout; resumed: the
new steps, identical again), that ``dressage-worker train --replica-url`` does the same, and that
the viewer's store reads from the replica.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from dressage.config import Settings
from dressage.errors import StoreError
from dressage.store import EventStore
from dressage.store.db import upgrade
from dressage.store.replica import open_replica_store, wait_for_replay
from dressage.training.consumer import Trainer
from dressage.training.steps import StepOptions
from dressage.view.readonly import open_readonly_store
from tests.log_builders import tiny_loop_config
from tests.store.test_server_crash import Cluster, _skip_reason
from tests.training.builders import build_run, simple

REPO = Path(__file__).resolve().parents[2]

OPTIONS = StepOptions(global_batch_size=2, n_samples_per_prompt=2)


class Standby(Cluster):
    """A hot standby of ``primary``: a base backup with ``-R`` (it streams WAL from the primary)."""

    def clone(self, primary: Cluster) -> None:
        self.sock.mkdir()
        shutil.chown(self.data.parent, "postgres")
        shutil.chown(self.sock, "postgres")
        self._as_postgres(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(self.data), "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Standby]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="dressage-replica-"))
    shutil.chown(root, "postgres")  # both data directories live below it
    (root / "primary").mkdir()
    (root / "standby").mkdir()
    primary, standby = Cluster(root / "primary"), Standby(root / "standby")
    try:
        primary.init()
        primary.start()
        upgrade(primary.url)
        standby.clone(primary)
        standby.start()
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


def _replay_paused(standby: Cluster, paused: bool) -> None:
    with psycopg.connect(standby.url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")


@pytest.mark.postgres
def test_batches_from_a_streaming_replica_are_byte_identical(clusters: tuple[Cluster, Standby]) -> None:
    primary_c, standby_c = clusters
    settings = Settings(database_url=primary_c.url, replica_url=standby_c.url)
    primary = EventStore.open(settings=settings, auto_upgrade=False)
    replica = open_replica_store(settings)
    assert replica is not None
    try:
        run = "replicated"
        groups = [
            [simple(1.0), simple(0.0)],
            [simple(2.0, n_turns=3), simple(0.5)],
            [simple(0.0), simple(1.0)],
        ]
        build_run(primary, run, groups)  # a rollout into the primary: sessions, turns, rewards
        wait_for_replay(primary, replica)
        with pytest.raises(StoreError):  # the replica refuses writes
            replica.runs.create("nope", {})

        want = Trainer(primary, run, OPTIONS, consumer="primary").run_steps()
        got = Trainer(primary, run, OPTIONS, consumer="replica", reader=replica).run_steps()
        assert len(want) == 3
        assert [r.batch.batch_hash for r in got] == [r.batch.batch_hash for r in want]
        assert [r.batch.manifest["samples"] for r in got] == [r.batch.manifest["samples"] for r in want]
        # The consumer's checkpoint and steps went to the primary.
        assert primary.consumers.checkpoint(run, "train:replica").step == 3

        # A lagging replica: the trainer waits for what the primary holds, and says so when it cannot.
        _replay_paused(standby_c, True)
        try:
            build_run(primary, run, [[simple(3.0), simple(1.0)], [simple(0.0), simple(2.0)]], first_task=3)
            lagging = Trainer(
                primary, run, OPTIONS, consumer="replica", reader=replica, replica_timeout_s=0.5
            )
            with pytest.raises(
                StoreError, match=r"the replica has replayed WAL up to .* but the reader needs"
            ):
                lagging.run_steps()
        finally:
            _replay_paused(standby_c, False)
        more_want = Trainer(primary, run, OPTIONS, consumer="primary").run_steps()
        more_got = Trainer(primary, run, OPTIONS, consumer="replica", reader=replica).run_steps()
        assert [r.batch.step for r in more_got] == [4, 5]
        assert [r.batch.batch_hash for r in more_got] == [r.batch.batch_hash for r in more_want]

        # The CLI: `dressage-worker train --replica-url` commits the same steps.
        from dressage.cli import app

        args = ["train", "--from-run", run, "--backend", "none", "--consumer", "cli"]
        args += ["--global-batch-size", "2", "--n-samples-per-prompt", "2"]
        args += ["--database-url", primary_c.url, "--replica-url", standby_c.url]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        cli_steps = primary.consumers.steps(run, "train:cli")
        assert [s.batch_hash for s in cli_steps] == [
            s.batch_hash for s in primary.consumers.steps(run, "train:primary")
        ]

        # The viewer reads from the replica when one is configured.
        viewer = open_readonly_store(settings, replica=True)
        try:
            assert viewer.db.engine.url.port == standby_c.port
            assert run in {r.name for r in viewer.runs.list()}
        finally:
            viewer.close()
    finally:
        replica.close()
        primary.close()


def test_the_loops_trainer_reads_from_the_replica(clusters: tuple[Cluster, Standby], tmp_path: Path) -> None:
    """``dressage-worker loop --replica-url``: one real iteration (dev engine, bwrap, answer agent) into
    the primary; its trainer reads through the replica and commits the same batch a primary-only
    trainer forms."""
    pytest.importorskip("torch", reason="the loop trains with torch (the 'engine' extra)")
    import yaml

    from dressage.loop.runner import Loop
    from dressage.training.masking import MaskingPolicy
    from tests.loop_driver import drive_loop
    from tests.rollout.conftest import bwrap_unavailable_reason

    if bwrap_unavailable_reason() is not None:
        pytest.skip(str(bwrap_unavailable_reason()))
    primary_c, standby_c = clusters
    settings = Settings(database_url=primary_c.url, replica_url=standby_c.url, home=tmp_path / "home")
    (tmp_path / "tasks.jsonl").write_text(
        "".join(f'{{"prompt": "Say {c}.", "label": "{c}"}}\n' for c in "ab")
    )
    tasks = {"path": str(tmp_path / "tasks.jsonl")}
    cfg = tiny_loop_config("loop-on-replica", tasks, reward="contains", lr=1.0, iterations=1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    store = EventStore.open(settings=settings, auto_upgrade=False)
    reader_port: list[int | None] = []

    def note_reader(loop: Loop) -> None:
        reader_port.append(loop.reader.db.engine.url.port if loop.reader is not None else None)

    try:
        loop, _ = drive_loop(store, settings, path, tmp_path / "out", quiet=True, on_start=note_reader)
        assert reader_port == [standby_c.port]  # the trainer's groups and turns came from the replica
        assert loop.reader is None  # closed with the loop
        (step,) = store.consumers.steps(loop.run_name, "train:loop")
        options = StepOptions(4, 2, masking=MaskingPolicy(failure_policy="keep_finished"))  # the loop's
        (want,) = Trainer(store, loop.run_name, options, consumer="check").run_steps()
        assert step.batch_hash == want.batch.batch_hash
    finally:
        store.close()
