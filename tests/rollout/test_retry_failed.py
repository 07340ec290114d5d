"""``rollout --resume RUN`` leaves pairs whose agent failed alone; ``--retry-failed`` retries them.

Real worker processes on the shared dev engine: an agent that crashes while a flag file exists fails
every pair (``max_attempts: 1``). A plain ``--resume`` plays nothing and says how to retry them; with
the flag gone, ``--resume --retry-failed`` finishes every pair once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.rollout.conftest import open_store, requires_bwrap, start_worker, write_config, write_tasks

pytestmark = requires_bwrap

TASKS = [{"prompt": f"Say '{c}'.", "label": c} for c in "ea"]
FLAKY = {"kind": "python", "path": "tests.rollout.agents_for_tests:fails_while_flagged"}


def _run(args: list[str], home: Path, flag: Path) -> tuple[int, str]:
    proc = start_worker(args, home, DRESSAGE_TEST_FAIL_FLAG=str(flag))
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out.decode(errors="replace")


def test_retry_failed_retries_agent_failures_and_plain_resume_does_not(
    tmp_path: Path, engine_url: str
) -> None:
    home, url, name = tmp_path / "home", f"sqlite:///{tmp_path / 'log.db'}", "retry-failed"
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    cfg = write_config(tmp_path, engine_url, name=name, agent=FLAKY, worker={"max_attempts": 1})
    flag = tmp_path / "fail"
    flag.touch()
    db = ["--database-url", url]

    rc, out = _run(["--config", str(cfg), *db], home, flag)
    assert rc == 1 and "no session of run 'retry-failed' finished" in out, out[-3000:]
    store = open_store(url, home)
    try:
        n = len(TASKS) * 2
        assert store.tasks.counts(name)["failed"] == n
        failed = store.sessions.list(name, status="failed")
        assert len(failed) == n and {s.finish_reason for s in failed} == {"agent_crashed"}

        rc, out = _run(["--resume", name, *db], home, flag)  # the flag is still there: nothing may run
        assert rc == 0, out[-3000:]
        assert f"{n} pairs whose agent failed stay failed (retry them with --retry-failed)" in out, out[
            -3000:
        ]
        assert len(store.sessions.list(name)) == n and store.tasks.counts(name)["failed"] == n

        flag.unlink()
        rc, out = _run(["--resume", name, "--retry-failed", *db], home, flag)
        assert rc == 0, out[-3000:]
        assert f"retrying {n} pairs whose agent failed (--retry-failed)" in out, out[-3000:]
        assert store.tasks.counts(name) == {"pending": 0, "leased": 0, "done": n, "failed": 0}
        finished = Counter(s.task_id for s in store.sessions.list(name, status="finished"))
        assert len(finished) == n and set(finished.values()) == {1}
    finally:
        store.close()


def test_retry_failed_needs_resume(tmp_path: Path) -> None:
    proc = start_worker(["--retry-failed", "--config", "run.yaml"], tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "--retry-failed retries the failed pairs of a run: give it with --resume RUN" in out.decode()


def test_retry_failed_with_ray_is_refused(tmp_path: Path) -> None:
    proc = start_worker(["--resume", "r", "--retry-failed", "--ray", "local"], tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "--retry-failed with --ray is not built yet" in out.decode()
