"""Real processes: kill -9 the train command mid-run, restart it, compare every step hash and the
final weights and optimizer state with an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dressage.config import Settings
from dressage.store import EventStore
from dressage.training import StepOptions, Trainer
from dressage.training.torch_backend import TorchBackend, checkpoint_metadata
from tests.training.builders import build_run, simple

WORKER = str(Path(sys.executable).with_name("dressage-worker"))


def groups(n_groups: int) -> list:
    return [[simple(float(g % 3), n_turns=1), simple(float(g % 2), n_turns=1)] for g in range(n_groups)]


def train_cmd(run: str, url: str, out: Path, *extra: str) -> list[str]:
    return [
        WORKER, "train", "--from-run", run, "--database-url", url, "--out", str(out),
        "--global-batch-size", "2", "--n-samples-per-prompt", "2", *extra,
    ]  # fmt: skip


def test_kill9_resume_is_byte_identical_and_replay_detects_drift(db_url: str, tmp_path: Path) -> None:
    store = EventStore.open(
        settings=Settings(database_url=db_url, home=tmp_path / "home"), auto_upgrade=False
    )
    suffix = os.urandom(4).hex()
    run_a, run_b = f"resume-a-{suffix}", f"resume-b-{suffix}"
    build_run(store, run_a, groups(5), seed=3)
    build_run(store, run_b, groups(5), seed=3)  # a copy of the same data
    # the uninterrupted reference, in this process: Adam, whose moments must survive the kill. Bitwise
    # equality needs the same intra-op thread count (it decides how CPU matmuls split their sums):
    # one thread here and in the train processes (OMP_NUM_THREADS=1).
    reference = TorchBackend(tmp_path / "ref", model="tiny-qwen3", optimizer="adam", lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = Trainer(store, run_a, StepOptions(2, 2), reference).run_steps()
    finally:
        torch.set_num_threads(threads)
    expected = [r.batch.batch_hash for r in results]
    assert len(expected) == 5

    env = {**os.environ, "DRESSAGE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "ckpt"
    torch_args = ("--backend", "torch", "--model", "tiny-qwen3", "--optimizer", "adam", "--lr", "0.01")
    proc = subprocess.Popen(
        train_cmd(run_b, db_url, out, *torch_args, "--throttle-s", "2"),
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.time() + 60
    while len(store.consumers.steps(run_b, "train:main")) < 2:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.time() < deadline, "the trainer did not commit 2 steps in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(store.consumers.steps(run_b, "train:main"))
    assert killed_at < 5
    done = subprocess.run(
        train_cmd(run_b, db_url, out, *torch_args), env=env, cwd=tmp_path, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert [s.batch_hash for s in store.consumers.steps(run_b, "train:main")] == expected
    meta = checkpoint_metadata(out / "step-000005.safetensors")
    assert (meta["run"], meta["step"]) == (run_b, "5")
    assert meta["position"] == str(store.consumers.checkpoint(run_b, "train:main").position)
    # same batches, same weights and Adam state carried over the kill: bitwise the reference's
    for name in ("step-000005.safetensors", "optim-000005.safetensors"):
        got, want = load_file(str(out / name)), load_file(str(tmp_path / "ref" / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name

    replay = subprocess.run(
        train_cmd(run_b, db_url, out, "--replay"), env=env, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert replay.returncode == 0, replay.stderr.decode()
    store.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_replay_cli_names_drift(db_url: str, tmp_path: Path) -> None:
    store = EventStore.open(
        settings=Settings(database_url=db_url, home=tmp_path / "home"), auto_upgrade=False
    )
    run = f"drift-{os.urandom(4).hex()}"
    build_run(store, run, groups(2))
    Trainer(store, run, StepOptions(2, 2)).run_steps()
    with store.db.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE turns SET generated_ids = '[1,2,3]' WHERE session_id = ?", (f"{run}-t1-s1-a1",)
        )
    env = {**os.environ, "DRESSAGE_HOME": str(tmp_path / "home")}
    res = subprocess.run(
        train_cmd(run, db_url, tmp_path, "--replay"), env=env, capture_output=True, timeout=60
    )
    assert res.returncode == 3
    err = " ".join(res.stderr.decode().split())
    assert "step 2" in err and f"{run}-t1-s1-a1" in err and "field tokens" in err
    store.close()
