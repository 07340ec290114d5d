"""Reward functions loaded by dotted path in tests."""

from __future__ import annotations

from dressage.rollout.rewards import RewardInput


def char_count(inp: RewardInput, char: str) -> tuple[float, dict]:
    """How often ``char`` occurs in the answer."""
    n = inp.answer.count(char)
    return float(n), {"count": n}


def broken(inp: RewardInput) -> float:
    """A buggy reward."""
    return 1 / 0


async def nan(inp: RewardInput) -> float:
    """A reward that is not a number."""
    return float("nan")
