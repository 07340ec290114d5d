"""The SWE agents: a whitebox edit/run agent and the oracle that applies the known patch.

:class:`EditRunAgent` loops through the chat dialect: a completion with the ``run``, ``view`` and
``edit`` tools (:mod:`recipes.swe.tools`) over the sandbox's checkout, each call run and its result
sent back as a ``tool`` message, until the model replies without a tool call (its fix is done) or
``max_turns`` is reached. The reward grades what the workspace holds then, not the reply.

:class:`OracleAgent` plays the known solution through the proxy (:mod:`recipes.forcing`): one
``run`` tool call applying the record's ``patch`` with ``git apply``, forced as the policy's reply,
run like any tool call, then a closing reply. Its modes: ``correct`` (the gold patch: reward 1),
``wrong`` (a change that does not fix the issue, a comment appended to the first file the gold patch
fixes: graded, not resolved, reward 0) and ``tamper`` (the gold patch plus an edit to a test file:
the integrity check gives 0 and says why).
"""

from __future__ import annotations

from typing import Literal

from dressage.agents.base import Agent, AgentContext, AgentResult
from dressage.agents.whitebox import _complete
from dressage.errors import AgentError, ConfigError
from recipes.forcing import forced_reply, tool_call_text
from recipes.swe.loader import record_of
from recipes.swe.records import patch_paths
from recipes.swe.tools import EditRunTools

SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in a repository, which is your current directory. "
    "Tools: run (a bash command in the repository root), view (a file with line numbers), edit "
    "(replace one exact piece of text in a file). Find the cause, change the code, and run the tests "
    "to check. When the fix is done, reply with a short summary and no tool call."
)
DONE = "The fix is applied."
HEREDOC = "DRESSAGE_PATCH_EOF"

Mode = Literal["correct", "wrong", "tamper"]


class EditRunAgent(Agent):
    """The whitebox edit/run agent (see the module docstring)."""

    name = "swe-edit-run"

    def __init__(
        self, system_prompt: str | None = None, max_turns: int = 30, tool_timeout_s: float = 60.0
    ) -> None:
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self.max_turns, self.tool_timeout_s = max_turns, tool_timeout_s

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Call tools until the model replies without one."""
        tools = EditRunTools(ctx.sandbox, self.tool_timeout_s)
        messages = ctx.task.chat_messages(self.system_prompt)
        answer = ""
        for turn in range(1, self.max_turns + 1):
            try:
                msg = (await _complete(ctx, messages, tools=tools.schemas)).choices[0].message
            except AgentError as e:
                if turn > 1 and "context" in str(e).lower():
                    ctx.log.write(f"turn {turn}: context window full, stopping: {e}")
                    return AgentResult(answer, "context_full", turn - 1, messages)
                raise
            answer = msg.content or ""
            calls = list(msg.tool_calls or [])
            if not calls:
                messages.append({"role": "assistant", "content": answer})
                return AgentResult(answer, "answered", turn, messages)
            messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
            for call in calls:
                output = await tools.call(call.function.name, call.function.arguments or "{}")
                ctx.log.write(
                    f"turn {turn}: {call.function.name}({call.function.arguments[:200]}) -> {output[:300]!r}"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        ctx.log.write(f"max_turns={self.max_turns} reached")
        return AgentResult(answer, "max_turns", self.max_turns, messages)


def oracle_command(patch: str, mode: Mode, test_file: str | None) -> str:
    """The shell command the oracle runs: apply ``patch`` (and, in ``tamper`` mode, edit a test), or
    in ``wrong`` mode append a comment to the first file ``patch`` changes."""
    if mode == "wrong":
        return f"echo '# not a fix' >> {patch_paths(patch)[0]}"
    apply = f"git apply -v <<'{HEREDOC}'\n{patch.rstrip(chr(10))}\n{HEREDOC}"
    if mode == "tamper" and test_file:
        return f"{apply}\necho '# edited by the agent' >> {test_file}"
    return apply


class OracleAgent(Agent):
    """Applies the record's ``patch`` through a forced ``run`` call (see the module docstring)."""

    name = "swe-oracle"

    def __init__(self, mode: Mode = "correct") -> None:
        if mode not in ("correct", "wrong", "tamper"):
            raise ConfigError(f"agent option mode must be 'correct', 'wrong' or 'tamper', got {mode!r}")
        self.mode = mode

    async def run(self, ctx: AgentContext) -> AgentResult:
        """The known patch's turns, each forced through the proxy."""
        record = record_of(ctx.task)
        tools = EditRunTools(ctx.sandbox, timeout_s=120)
        test_file = next(iter(patch_paths(record.test_patch)), None)
        command = oracle_command(record.patch, self.mode, test_file)
        messages = ctx.task.chat_messages(SYSTEM_PROMPT)
        msg = await forced_reply(ctx, messages, tool_call_text("run", {"command": command}), tools.schemas)
        messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
        for call in msg.tool_calls or []:
            output = await tools.call(call.function.name, call.function.arguments or "{}")
            ctx.log.write(f"oracle: {call.function.name} -> {output[:300]!r}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        msg = await forced_reply(ctx, messages, DONE, tools.schemas)
        messages.append({"role": "assistant", "content": msg.content or ""})
        return AgentResult(msg.content or "", "answered", 2, messages)
