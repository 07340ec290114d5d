"""``dressage-worker loop`` on a Harbor dataset: rewards from each task's own test.sh train the tiny model.

Two of the example letter tasks (examples/harbor/letters), two samples each, two iterations in
bubblewrap; the assertions are about what the log must show (rewards from the verifier, a training
step per iteration, a pushed policy version), never about reward values (examples/harbor.yaml and
docs/harbor.md show the curve of a longer run).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import require_module

require_module("torch", "the loop trains with torch (the 'engine' extra)")


from dressage.config import Settings  # noqa: E402
from dressage.store import EventStore  # noqa: E402
from tests.harbor.conftest import REPO  # noqa: E402
from tests.log_builders import tiny_loop_config  # noqa: E402
from tests.loop_driver import drive_loop  # noqa: E402
from tests.rollout.conftest import requires_bwrap  # noqa: E402

pytestmark = [requires_bwrap]


def test_loop_trains_on_a_harbor_dataset(tmp_path: Path) -> None:
    letters = {"path": str(REPO / "examples" / "harbor" / "letters"), "limit": 2}
    cfg = tiny_loop_config("harbor-loop", letters, reward="harbor", lr=50.0, iterations=2)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
    store = EventStore.open(settings=settings)
    loop, _ = drive_loop(store, settings, path, tmp_path / "out", quiet=True)
    try:
        run = store.runs.get(loop.run_name)
        assert sorted(run.config["harbor_tasks"]) == ["01-e", "02-a"]
        assert [s.finished for s in loop.stats] == [4, 4]
        rewards = [e.payload for e in store.events.read(run, kinds=("reward",))]
        assert len(rewards) == 8
        assert all(r["details"]["source"] == "reward.txt" and r["reward"] in (0.0, 1.0) for r in rewards)
        assert [e.payload["version"] for e in store.events.read(run, kinds=("policy_version",))] == [0, 1, 2]
        steps = store.consumers.steps(run, "train:loop")
        assert [sorted(g["task_index"] for g in s.manifest["groups"]) for s in steps] == [[0, 1], [2, 3]]
    finally:
        store.close()
