"""A TextWorld game as the agent's tool: ``act(command)`` sends one command and returns what happens.

The game runs in the worker's process (TextWorld's Z-machine interpreter, through Jericho), each call
in a thread so the worker's event loop (and its proxy) never waits on it. :func:`replay` plays a list
of commands in a fresh copy of the game: the reward scores what the commands achieve, not what the
agent reports.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.extras import require

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "act",
            "description": "Send one command to the game (e.g. 'look', 'go north', 'take key'); returns what happens.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to type."}},
                "required": ["command"],
            },
        },
    }
]
"""The tool's OpenAI function schema."""


@dataclass
class Outcome:
    """Where a game stands: score out of the maximum, won or lost, moves made."""

    score: float
    max_score: float
    won: bool
    lost: bool
    moves: int

    def status(self) -> str:
        """One line for the model: score, moves, and the end when it came."""
        end = (
            " The game is over: you won."
            if self.won
            else (" The game is over: you lost." if self.lost else "")
        )
        return f"[score {self.score:g}/{self.max_score:g}, moves {self.moves}]{end}"


def _start(game_file: Path) -> tuple[Any, Any]:
    textworld = require("textworld", "textworld")
    infos = textworld.EnvInfos(
        description=True, objective=True, score=True, max_score=True, won=True, lost=True, moves=True
    )
    with warnings.catch_warnings():
        # Jericho warns that it cannot detect the score of TextWorld's games; TextWorld tracks it itself.
        warnings.filterwarnings("ignore", message=".*is not fully supported.*")
        env = textworld.start(str(game_file), request_infos=infos)
        return env, env.reset()


def _outcome(state: Any) -> Outcome:
    return Outcome(
        score=float(state.score or 0),
        max_score=float(state.max_score or 0),
        won=bool(state.won),
        lost=bool(state.lost),
        moves=int(state.moves or 0),
    )


class Game:
    """One running game (see the module docstring); ``close`` ends it."""

    def __init__(self, env: Any, state: Any) -> None:
        self._env = env
        self.outcome = _outcome(state)
        self.first_view = str(state.description or "").strip()
        self.commands: list[str] = []

    @classmethod
    async def start(cls, game_file: Path) -> Game:
        """Start ``game_file`` (in a thread)."""
        env, state = await asyncio.to_thread(_start, game_file)
        return cls(env, state)

    @property
    def done(self) -> bool:
        """Won or lost."""
        return self.outcome.won or self.outcome.lost

    async def act(self, command: str) -> str:
        """Send ``command``; the game's answer with the status line."""
        if self.done:
            return "The game is over; reply without a tool call."
        self.commands.append(command)
        state, _, _ = await asyncio.to_thread(self._env.step, command)
        self.outcome = _outcome(state)
        return f"{str(state.feedback or '').strip()}\n{self.outcome.status()}"

    async def call(self, name: str, arguments: str) -> str:
        """Run tool ``name`` with its JSON ``arguments``; a malformed call is answered with an error text."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON ({e.msg})"
        if name != "act" or not isinstance(args, dict) or not isinstance(args.get("command"), str):
            return f"error: call act with a command, got {name}({arguments[:200]})"
        return await self.act(args["command"])

    def close(self) -> None:
        """End the interpreter."""
        self._env.close()


def replay(game_file: Path, commands: list[str]) -> Outcome:
    """The outcome of ``commands`` played in a fresh copy of ``game_file`` (stops at the game's end)."""
    env, state = _start(game_file)
    try:
        for command in commands:
            if state.won or state.lost:
                break
            state, _, _ = env.step(command)
        return _outcome(state)
    finally:
        env.close()
