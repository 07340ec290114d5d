"""The TextWorld reward: the game's own score and win, from replaying the agent's commands.

The agent reports the commands it sent (``AgentResult.info["commands"]``); the reward plays them in a
fresh copy of the game (:func:`recipes.textworld.play.replay`), so the score is the game's, not the
agent's claim. ``metric: score`` (default) is the score over the game's maximum (1.0 exactly when the
quest is completed), ``metric: win`` 1.0 for a win, else 0.
"""

from __future__ import annotations

import asyncio

from dressage.errors import RewardError
from dressage.rollout.rewards import RewardInput, RewardOutput
from recipes.textworld.loader import game_file_of
from recipes.textworld.play import replay


async def score(inp: RewardInput, metric: str = "score") -> RewardOutput:
    """The reward of one episode (see the module docstring)."""
    if metric not in ("score", "win"):
        raise RewardError(f"reward option metric must be 'score' or 'win', got {metric!r}")
    meta = inp.task.metadata.get("textworld")
    if not isinstance(meta, dict):
        raise RewardError(
            f"task {inp.task.id or inp.task.index} is not a TextWorld task (no metadata.textworld)"
        )
    commands = inp.result.info.get("commands")
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise RewardError(
            "the agent reported no command list (AgentResult.info['commands']); use a TextWorld agent"
        )
    try:
        game_file = await asyncio.to_thread(game_file_of, meta)
    except FileNotFoundError as e:
        raise RewardError(str(e)) from None
    out = await asyncio.to_thread(replay, game_file, commands)
    value = (
        (out.score / out.max_score if out.max_score else float(out.won))
        if metric == "score"
        else float(out.won)
    )
    details = {
        "metric": metric,
        "score": out.score,
        "max_score": out.max_score,
        "won": out.won,
        "lost": out.lost,
        "moves": out.moves,
        "commands": commands[-50:],
    }
    return RewardOutput(value, details)
