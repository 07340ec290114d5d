"""Whitebox agents: Python code that talks to the proxy with the official OpenAI client.

Two ship with Dressage: :class:`AnswerAgent` (one completion, its text is the answer) and
:class:`CodingAgent` (calls the sandbox tools ``shell_exec``/``file_read``/``file_write`` until it
replies without a tool call, or ``max_turns`` is reached). Your own agent is a subclass of
:class:`~dressage.agents.base.Agent` or an ``async def agent(ctx) -> AgentResult | str``, selected
with ``kind: python`` and a dotted path (:func:`load_python_agent`).

A model may emit anything (a random-weight dev model emits random tokens): no tool call means the
agent answers, malformed tool arguments come back to the model as an error text, and ``max_turns``
caps every loop.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dressage.agents.base import Agent, AgentContext, AgentResult, ResumePoint
from dressage.errors import AgentError, ConfigError, NotSupportedError

if TYPE_CHECKING:
    import openai

DEFAULT_CODING_PROMPT = (
    "You are a coding agent working in a sandbox whose current directory holds the task's files. "
    "Use the tools to inspect files, run commands and write code. When you are done, reply with a "
    "short final answer and no tool call."
)


def _sampling_kwargs(ctx: AgentContext) -> dict[str, Any]:
    """Request parameters the OpenAI client accepts, from the run's sampling settings."""
    allowed = ("max_tokens", "temperature", "top_p", "seed", "stop")
    kwargs: dict[str, Any] = {k: v for k, v in ctx.sampling.items() if k in allowed and v is not None}
    if ctx.sampling.get("enable_thinking") is not None:
        kwargs["extra_body"] = {
            "chat_template_kwargs": {"enable_thinking": bool(ctx.sampling["enable_thinking"])}
        }
    return kwargs


async def _complete(ctx: AgentContext, messages: list[dict[str, Any]], **extra: Any) -> Any:
    """One chat completion through the proxy; API failures become :class:`AgentError`."""
    import openai  # here, not at the top: the CLI (its dev engine, store commands) starts without it

    try:
        return await ctx.client.chat.completions.create(
            model=ctx.model,
            messages=messages,  # type: ignore[arg-type]  # plain dicts: the wire format
            **_sampling_kwargs(ctx),
            **extra,
        )
    except openai.APIStatusError as e:
        raise AgentError(f"the proxy answered HTTP {e.status_code}: {_error_text(e)}") from e
    except openai.APIConnectionError as e:
        raise AgentError(f"cannot reach the proxy at {ctx.client.base_url}: {e}") from e


def _error_text(e: openai.APIStatusError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    msg = err.get("message") if isinstance(err, dict) else None
    return str(msg or e.message)[:500]


class AnswerAgent(Agent):
    """One completion; the assistant text is the answer. With ``rounds`` > 1 the agent asks again
    (:data:`AGAIN`) after each reply, in the same conversation, and the last reply is the answer: a
    multi-turn episode even a tiny model completes (a tree rollout forks at its turns)."""

    name = "answer"
    AGAIN = "Answer again, in as few words as possible."

    def __init__(self, system_prompt: str | None = None, rounds: int = 1) -> None:
        self.system_prompt = system_prompt
        self.rounds = rounds

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Ask (``rounds`` times), answer with the last reply's text."""
        messages = ctx.task.chat_messages(self.system_prompt)
        answer, finish = "", "stop"
        for turn in range(1, self.rounds + 1):
            if turn > 1:
                messages.append({"role": "user", "content": self.AGAIN})
            resp = await _complete(ctx, messages)
            choice = resp.choices[0]
            answer, finish = choice.message.content or "", str(choice.finish_reason or "stop")
            ctx.log.write(f"turn {turn} finish_reason={choice.finish_reason} answer={answer!r}")
            messages.append({"role": "assistant", "content": answer})
        return AgentResult(answer=answer, finish_reason=finish, turns=self.rounds, messages=messages)


class CodingAgent(Agent):
    """Loops: completion with the sandbox tools; run every tool call; stop at a reply without one."""

    name = "coding"

    def __init__(
        self, system_prompt: str | None = None, max_turns: int = 8, tool_timeout_s: float = 30.0
    ) -> None:
        self.system_prompt = system_prompt or DEFAULT_CODING_PROMPT
        self.max_turns = max_turns
        self.tool_timeout_s = tool_timeout_s

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Run the tool loop; see the class docstring."""
        return await self._loop(ctx, ctx.task.chat_messages(self.system_prompt), 1)

    def resume_refusal(self, point: ResumePoint) -> str | None:
        """A chat-completions request whose messages and tools this agent would have sent."""
        if point.dialect != "chat":
            return f"agent {self.name!r} speaks chat completions, the recorded request is {point.dialect!r}"
        messages = point.request.get("messages")
        if not isinstance(messages, list) or not messages:
            return "the recorded request has no messages"
        return None

    async def resume(self, ctx: AgentContext, point: ResumePoint) -> AgentResult:
        """Continue the tool loop from the recorded request's messages (its turn number: one more
        than the assistant messages it holds), so ``max_turns`` counts as in the original run."""
        refusal = self.resume_refusal(point)
        if refusal is not None:
            raise NotSupportedError(refusal)
        messages = [dict(m) for m in point.request["messages"]]
        done = sum(1 for m in messages if m.get("role") == "assistant")
        ctx.log.write(f"resumed at turn {done + 1} from {point.source or f'turn {point.turn_index}'}")
        return await self._loop(ctx, messages, done + 1)

    async def _loop(self, ctx: AgentContext, messages: list[dict[str, Any]], first: int) -> AgentResult:
        """Turns ``first .. max_turns`` of the tool loop over ``messages``."""
        tools = ctx.tools.schemas
        answer = ""
        for turn in range(first, self.max_turns + 1):
            try:
                resp = await _complete(ctx, messages, tools=tools)
            except AgentError as e:
                if turn > 1 and "context" in str(e).lower():
                    ctx.log.write(f"turn {turn}: context window full, stopping: {e}")
                    return AgentResult(answer, "context_full", turn - 1, messages)
                raise
            msg = resp.choices[0].message
            answer = msg.content or ""
            calls = list(msg.tool_calls or [])
            ctx.log.write(f"turn {turn}: {len(calls)} tool call(s), text={answer[:200]!r}")
            if not calls:
                messages.append({"role": "assistant", "content": answer})
                return AgentResult(answer, "answered", turn, messages)
            messages.append(msg.model_dump(exclude_none=True, exclude_unset=True, mode="json"))
            for call in calls:
                name, args = call.function.name, call.function.arguments or "{}"
                output = await ctx.tools.call(name, args)
                ctx.log.write(f"  tool {name}({args[:200]}) -> {output[:300]!r}")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        ctx.log.write(f"max_turns={self.max_turns} reached")
        return AgentResult(answer, "max_turns", self.max_turns, messages)


AgentFn = Callable[[AgentContext], Awaitable["AgentResult | str"]]


class FunctionAgent(Agent):
    """Wraps ``async def agent(ctx)``; a returned ``str`` becomes the answer."""

    def __init__(self, fn: AgentFn, name: str) -> None:
        self.fn = fn
        self.name = name

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Call the function and normalise its result."""
        out = await self.fn(ctx)
        if isinstance(out, AgentResult):
            return out
        if isinstance(out, str):
            return AgentResult(answer=out)
        raise AgentError(
            f"agent function {self.name} returned {type(out).__name__}; return AgentResult or str"
        )


def import_object(path: str, what: str) -> Any:
    """Import ``pkg.mod:attr`` (or ``pkg.mod.attr``); a failure is a :class:`ConfigError`."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"{what} {path!r}: cannot import module {module_name!r} ({e}); is it on PYTHONPATH?"
        ) from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise ConfigError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from e


def load_python_agent(path: str, options: dict[str, Any]) -> Agent:
    """Build an agent from a dotted path: an :class:`Agent` subclass (``options`` as kwargs) or a function."""
    obj = import_object(path, "agent")
    if inspect.isclass(obj) and issubclass(obj, Agent):
        try:
            return obj(**options)
        except TypeError as e:
            raise ConfigError(f"agent {path!r} does not accept options {sorted(options)}: {e}") from e
    if inspect.iscoroutinefunction(obj):
        if options:
            raise ConfigError(f"agent {path!r} is a function; 'options' only apply to Agent classes")
        return FunctionAgent(obj, name=path)
    raise ConfigError(
        f"agent {path!r} must be an Agent subclass or an async function, got {type(obj).__name__}"
    )
