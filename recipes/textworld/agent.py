"""The TextWorld agents: a whitebox game agent and the walkthrough oracle.

:class:`GameAgent` loops: a chat completion with the ``act`` tool (:mod:`recipes.textworld.play`),
each command sent to the game and its answer returned as a ``tool`` message, until the game is won or
lost, the model replies without a tool call, or ``max_turns`` is reached. The first user message is
the goal and the starting room's description.

:class:`WalkthroughAgent` is the oracle: it plays the game's own walkthrough, each command a tool call
forced through the proxy (:mod:`recipes.forcing`), and wins (reward 1); ``mode: wrong`` plays
``look`` as many times instead (reward 0). Both report the commands sent (``info["commands"]``), which
the reward replays.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from dressage.agents.base import Agent, AgentContext, AgentResult
from dressage.agents.whitebox import _complete
from dressage.errors import AgentError, ConfigError
from recipes.extras import require
from recipes.forcing import forced_reply, tool_call_text
from recipes.textworld.loader import game_file_of
from recipes.textworld.play import TOOLS, Game

SYSTEM_PROMPT = "You play text adventure games by calling the act tool with one command at a time."
DONE = "Done."


async def _start(ctx: AgentContext) -> tuple[Game, list[dict[str, Any]]]:
    """The game of the task, started, and the opening conversation (goal and first room)."""
    meta = ctx.task.metadata.get("textworld")
    if not isinstance(meta, dict):
        raise AgentError(
            f"task {ctx.task.id or ctx.task.index} is not a TextWorld task (no metadata.textworld)"
        )
    try:
        game_file = await asyncio.to_thread(game_file_of, meta)
    except FileNotFoundError as e:
        raise AgentError(str(e)) from None
    game = await Game.start(game_file)
    messages = ctx.task.chat_messages(SYSTEM_PROMPT)
    messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n\n{game.first_view}"}
    return game, messages


def _result(answer: str, finish: str, turns: int, messages: list[dict[str, Any]], game: Game) -> AgentResult:
    o = game.outcome
    info = {"commands": list(game.commands), "score": o.score, "max_score": o.max_score, "won": o.won}
    return AgentResult(answer, finish, turns, messages, info)


class GameAgent(Agent):
    """The whitebox game agent (see the module docstring)."""

    name = "textworld-game"

    def __init__(self, system_prompt: str | None = None, max_turns: int = 20) -> None:
        require("textworld", "textworld")  # at config load: a missing extra stops the run before it starts
        self.system_prompt = system_prompt
        self.max_turns = max_turns

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Play until the game ends, the model stops calling ``act``, or ``max_turns``."""
        game, messages = await _start(ctx)
        if self.system_prompt:
            messages[0] = {"role": "system", "content": self.system_prompt}
        try:
            answer = ""
            for turn in range(1, self.max_turns + 1):
                msg = (await _complete(ctx, messages, tools=TOOLS)).choices[0].message
                answer = msg.content or ""
                calls = list(msg.tool_calls or [])
                if not calls:
                    messages.append({"role": "assistant", "content": answer})
                    return _result(answer, "answered", turn, messages, game)
                messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
                for call in calls:
                    output = await game.call(call.function.name, call.function.arguments)
                    ctx.log.write(f"turn {turn}: {call.function.arguments[:200]} -> {output[:300]!r}")
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                if game.done:
                    return _result(answer, "won" if game.outcome.won else "lost", turn, messages, game)
            return _result(answer, "max_turns", self.max_turns, messages, game)
        finally:
            game.close()


class WalkthroughAgent(Agent):
    """The oracle: the game's walkthrough, each command forced through the proxy (see the module docstring)."""

    name = "textworld-walkthrough"

    def __init__(self, mode: Literal["correct", "wrong"] = "correct") -> None:
        if mode not in ("correct", "wrong"):
            raise ConfigError(f"agent option mode must be 'correct' or 'wrong', got {mode!r}")
        require("textworld", "textworld")
        self.mode = mode

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Play the walkthrough (or ``look`` as often), then say :data:`DONE`."""
        game, messages = await _start(ctx)
        walkthrough = list(ctx.task.metadata["textworld"]["walkthrough"])
        commands = walkthrough if self.mode == "correct" else ["look"] * len(walkthrough)
        try:
            for command in commands:
                msg = await forced_reply(ctx, messages, tool_call_text("act", {"command": command}), TOOLS)
                messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
                for call in msg.tool_calls or []:
                    output = await game.call(call.function.name, call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
            msg = await forced_reply(ctx, messages, DONE, TOOLS)
            messages.append({"role": "assistant", "content": msg.content or ""})
            return _result(DONE, "answered", len(commands) + 1, messages, game)
        finally:
            game.close()
