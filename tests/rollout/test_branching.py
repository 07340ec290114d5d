"""The ``branching:`` section: one clear message per mistake, and the fork-point rules."""

from __future__ import annotations

import numpy as np
import pytest

from dressage.errors import ConfigError
from dressage.rollout.config import BranchingConfig, parse_config

BASE = {"run": "r", "dataset": {"path": "t.jsonl"}}


@pytest.mark.parametrize(
    ("branching", "message"),
    [
        ({"width": 0, "turns": [1]}, "branching.width: Input should be greater than or equal to 1"),
        ({"width": 2}, "branching: at: turns needs turns: [K, ...]"),
        ({"turns": [0]}, "turns must be distinct integers >= 1, got [0]"),
        ({"turns": [2, 2]}, "turns must be distinct integers >= 1, got [2, 2]"),
        ({"turns": [1], "points": 2}, "points applies to at: lowest_logprob"),
        ({"at": "lowest_logprob", "turns": [1]}, "turns applies to at: turns"),
        ({"at": "highest_entropy"}, "branching.at: Input should be 'turns' or 'lowest_logprob'"),
        (
            {"turns": [1], "token_budget": 0},
            "branching.token_budget: Input should be greater than or equal to 1",
        ),
        ({"turns": [1], "widht": 2}, "branching.widht: unknown field"),
        (
            {"width": 8, "depth": 4, "at": "lowest_logprob", "points": 2},
            "a tree of width 8, depth 4 and 2 fork point(s) per session may hold 69905 sessions; at most 1024",
        ),
    ],
)
def test_branching_mistakes_name_the_field(branching: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^config: ") as e:
        parse_config({**BASE, "branching": branching})
    assert message in str(e.value)


def test_a_tree_run_refuses_another_estimator() -> None:
    with pytest.raises(ConfigError, match="a tree run \\(branching\\) trains with 'tree'"):
        parse_config({**BASE, "branching": {"turns": [1]}, "train": {"advantage_estimator": "grpo"}})
    cfg = parse_config({**BASE, "branching": {"turns": [1]}, "train": {"advantage_estimator": "tree"}})
    assert cfg.branching is not None and cfg.snapshot()["branching"]["turns"] == [1]
    assert "branching" not in parse_config(BASE).snapshot()  # runs from before trees compare equal


def _logprobs(*means: float) -> list[np.ndarray]:
    return [np.full(3, m, dtype=np.float32) for m in means]


def test_fixed_turns_fork_within_the_sessions_own_turns() -> None:
    cfg = BranchingConfig(width=2, depth=2, turns=[1, 3, 9])
    five = _logprobs(-1, -1, -1, -1, -1)
    assert cfg.fork_turns(five, own_from=0) == [1, 3]  # 9 is past the last turn (4)
    assert cfg.fork_turns(five, own_from=1) == [3]  # a branch forked at 1 owns turns 1..: forks after
    assert cfg.fork_turns(five, own_from=3) == []


def test_lowest_logprob_picks_the_least_likely_turns() -> None:
    cfg = BranchingConfig(width=2, at="lowest_logprob", points=2)
    lp = _logprobs(-9.0, -0.5, -2.0, -0.1, -2.0)
    assert cfg.fork_turns(lp, own_from=0) == [2, 4]  # turn 0 is never a fork point (nothing shared)
    assert cfg.fork_turns(lp, own_from=2) == [3, 4]  # turns 3.. are the branch's own
    one = BranchingConfig(width=2, at="lowest_logprob")
    assert one.fork_turns(lp, own_from=0) == [2]  # a tie goes to the earlier turn
