"""``dressage-worker loop`` on a tree config (``examples/quickstart-tree.yaml``) on the CPU.

The quickstart's tree variant, cut to 2 tasks and 2 iterations (no eval): each iteration grows a
tree per task (the answer agent replies 3 times; forks at the least likely turn), trains it with
the tree estimator, and pushes the weights. The log must show: every step's groups are trees
(``tree`` in the group decision), each step trains exactly the tokens the engine generated for its
trees (a replayed turn, shared by a branch with its parent, counts once), and replay re-forms
every step bitwise.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dressage.config import Settings
from dressage.store import EventStore
from tests.loop.test_loop import replay
from tests.loop_driver import drive_loop

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-tree.yaml"


def _config(tmp: Path) -> Path:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["dataset"] = {"path": str(EXAMPLE.parent / cfg["dataset"]["path"]), "limit": 2}
    cfg.pop("eval")
    cfg["sandbox"] = {"provider": "local", "timeout_s": 20}
    cfg["worker"].update(concurrency=4, poll_s=0.1)
    cfg["loop"]["iterations"] = 2
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_loop_trains_trees_with_shared_tokens_once(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path / "home")
    store = EventStore.open(settings=settings)
    loop, _ = drive_loop(store, settings, _config(tmp_path), tmp_path / "out")
    try:
        run = loop.run_name
        steps = store.consumers.steps(run, "train:loop")
        assert len(steps) == 2
        sessions = {s.id: s for s in store.sessions.list(run)}
        assert any(s.parent_session_id for s in sessions.values())  # the trees forked
        for step in steps:
            assert step.manifest["options"]["advantage_estimator"] == "tree"
            members: list[str] = []
            for group in step.manifest["groups"]:
                assert group["kept"] and group["tree"]["nodes"]
                members += [m["session"] for m in group["members"]] + [f["session"] for f in group["forks"]]
            turns = store.turns.read(session_ids=members, with_experts=False)
            live = sum(int(t.loss_mask.sum()) for t in turns if "replayed_from" not in t.info)
            every = sum(int(t.loss_mask.sum()) for t in turns)
            assert step.manifest["n_trainable_tokens"] == live < every
        result = replay(settings, run)
        assert result.exit_code == 0, result.output
        assert "every batch hash matches" in result.output
    finally:
        store.close()
