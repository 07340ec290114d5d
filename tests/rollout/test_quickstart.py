"""The README's main command: `dressage-worker rollout --config examples/quickstart.yaml`, as a user
runs it (the worker starts its own dev engine; SQLite under ./.dressage of the working directory).
The run is the session's one run of the README quickstart as printed (the ``readme_quickstart``
fixture, shared with tests/test_readme_newcomer.py)."""

from __future__ import annotations

from pathlib import Path

from dressage.exports.export import export_run
from dressage.tito.profiles import build_profile
from tests.exports.sft_checks import assert_trl_tokenizes_exact_rows
from tests.quickstart_run import QuickstartRun
from tests.rollout.conftest import open_store


def test_quickstart_runs_and_tells_what_to_look_at(readme_quickstart: QuickstartRun, tmp_path: Path) -> None:
    r, elapsed, home = (
        readme_quickstart.done,
        readme_quickstart.elapsed_s,
        readme_quickstart.folder / ".dressage",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dressage-worker runs" in r.stderr and "dressage-worker show" in r.stderr
    store = open_store(f"sqlite:///{home / 'dressage.db'}", home)
    summary = store.runs.summary("quickstart")
    # 12 tasks x 4 samples, and the eval round of policy version 0: 6 held-out tasks x 2
    assert summary.sessions == {"finished": 60} and summary.turns == 60
    assert store.tasks.counts("quickstart", kind="eval") == {
        "pending": 0,
        "leased": 0,
        "done": 12,
        "failed": 0,
    }
    assert "held-out letters (eval)" in r.stderr
    train_ids = {s.id for s in store.sessions.list("quickstart") if "eval_version" not in s.info}
    assert len(train_ids) == 48
    rewards = [s.reward for s in store.sessions.list("quickstart") if s.id in train_ids]
    assert 0.0 < sum(rewards) / len(rewards) < 1.0  # the task set has signal: some answers earn it, some not
    assert elapsed < 180, f"quickstart took {elapsed:.0f}s"
    # its rewarded sessions as an SFT dataset: TRL tokenizes every unflagged row to the recorded ids
    out = tmp_path / "sft"
    manifest = export_run(store, "quickstart", out, where="reward >= 1 AND kind = 'train'", fmt="sft")
    store.close()
    exact = assert_trl_tokenizes_exact_rows(out, build_profile("qwen3.5"), tmp_path)
    assert exact > 0 and manifest["counts"]["sft_rows"] - manifest["counts"]["flagged"] == exact
