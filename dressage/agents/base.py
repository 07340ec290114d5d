"""What an agent receives and returns, whitebox or blackbox.

An agent gets an :class:`AgentContext` (the task, an OpenAI client bound to its proxy session, the
sandbox and its tools, the sampling settings, a log) and returns an :class:`AgentResult` whose
``answer`` the reward scores. Everything the model generates goes through the proxy, so the agent
never has to record tokens itself.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dressage.errors import NotSupportedError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from dressage.paddock import Sandbox, SandboxTools


@dataclass(frozen=True)
class Task:
    """One dataset row: ``prompt`` or ``messages`` (exactly one), a ``label`` for the reward, extras.

    ``files`` seed the sandbox workspace before the agent starts; ``tests`` are written only when the
    ``tests`` reward runs (the agent never sees them). ``index`` is the row number (= group index).
    ``kind`` is the task kind (:mod:`dressage.rollout.task_kinds`): ``row`` for a JSONL row, else the
    name of the kind that loaded it (``harbor``), whose data is in ``metadata[kind]``.
    """

    index: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    tests: dict[str, str] = field(default_factory=dict)
    id: str | None = None
    kind: str = "row"

    def chat_messages(self, system_prompt: str | None = None) -> list[dict[str, Any]]:
        """The conversation to send: the row's messages, or a user turn with the prompt."""
        msgs = (
            [dict(m) for m in self.messages]
            if self.messages
            else [{"role": "user", "content": self.prompt or ""}]
        )
        if system_prompt and not any(m.get("role") == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": system_prompt})
        return msgs

    def prompt_text(self) -> str:
        """A single text for programs that take one prompt (the last user message for chat rows)."""
        if self.prompt is not None:
            return self.prompt
        users = [m for m in self.messages or [] if m.get("role") == "user"]
        content = users[-1].get("content", "") if users else ""
        return content if isinstance(content, str) else str(content)

    def to_payload(self) -> dict[str, Any]:
        """The JSON stored with the task in the log's queue (so a resumed run needs no dataset file).

        ``kind`` is left out for a ``row`` (the payload of a JSONL row is what it always was)."""
        return {
            **({"kind": self.kind} if self.kind != "row" else {}),
            "index": self.index,
            "id": self.id,
            "prompt": self.prompt,
            "messages": self.messages,
            "label": self.label,
            "metadata": self.metadata,
            "files": self.files,
            "tests": self.tests,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Task:
        """Inverse of :meth:`to_payload`.

        A payload queued before tasks had a kind says it only by its metadata: a ``harbor`` entry."""
        metadata = dict(payload.get("metadata") or {})
        kind = payload.get("kind") or ("harbor" if isinstance(metadata.get("harbor"), dict) else "row")
        return cls(
            kind=str(kind),
            index=int(payload["index"]),
            id=payload.get("id"),
            prompt=payload.get("prompt"),
            messages=payload.get("messages"),
            label=payload.get("label"),
            metadata=metadata,
            files=dict(payload.get("files") or {}),
            tests=dict(payload.get("tests") or {}),
        )


class AgentLog:
    """Timestamped text lines of one episode; archived as the session's ``agent.log`` artifact."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._lines: list[str] = []

    def write(self, text: str) -> None:
        """Append ``text`` (may span lines), prefixed with seconds since the episode began."""
        stamp = f"[{time.monotonic() - self._t0:8.3f}] "
        for line in text.splitlines() or [""]:
            self._lines.append(stamp + line)

    def text(self) -> str:
        """Everything written so far."""
        return "\n".join(self._lines) + ("\n" if self._lines else "")


@dataclass
class AgentContext:
    """Everything one episode's agent may use.

    ``client`` is an ``openai.AsyncOpenAI`` whose base URL is the proxy session (host side);
    ``sandbox_base_url`` is the same session as seen from inside the sandbox (through the Unix-socket
    forwarder when the sandbox has no network) and ``token`` its bearer token; blackbox adapters use
    those two. ``sampling`` holds request parameters (``max_tokens``, ``temperature``, ``top_p``).
    """

    task: Task
    client: AsyncOpenAI
    model: str
    sandbox: Sandbox
    tools: SandboxTools
    session_id: str
    token: str
    sandbox_base_url: str
    sampling: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0
    log: AgentLog = field(default_factory=AgentLog)
    secret_env: dict[str, str] = field(default_factory=dict)
    """The run's declared ``secrets.agent`` values, set in a blackbox agent's environment (never stored)."""


@dataclass
class AgentResult:
    """What an episode produced: the ``answer`` to score and how it ended."""

    answer: str
    finish_reason: str = "answered"
    turns: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed agent starts: request ``turn_index`` of a recorded session, as it was sent.

    ``request`` is that request's body (JSON, secrets redacted) in ``dialect`` (``chat``,
    ``messages``, ``responses``, ``gemini``): the conversation state at turn K. The sandbox holds
    the checkpoint of the same moment (its tools had run, the agent waited for the model), and the
    turns before K are already in the session, so a resumed agent sends request K first, and it
    must render to the same prompt ids (the proxy checks: :mod:`dressage.proxy.checkpoint_start`).
    """

    turn_index: int
    dialect: str
    request: dict[str, Any]
    source: str = ""
    """Which session and turn it came from, for messages."""


class Agent(abc.ABC):
    """An agent: ``await agent.run(ctx)`` plays one episode. One instance serves many episodes.

    An agent that can start mid-episode from a recorded request (forks and take-overs from a
    sandbox checkpoint, without re-running a tool) overrides :meth:`resume_refusal` and
    :meth:`resume`; others are replayed from the start (docs/rollout.md, "Checkpoints"). A blackbox
    CLI agent implements the same two methods with its own session files and resume command.
    """

    name: str = "agent"

    @abc.abstractmethod
    async def run(self, ctx: AgentContext) -> AgentResult:
        """Play one episode. Raise :class:`~dressage.errors.AgentError` for a failed attempt."""

    def resume_refusal(self, point: ResumePoint) -> str | None:
        """Why this agent cannot resume from ``point`` (None: it can); the session records it and
        replays instead."""
        return f"agent {self.name!r} has no resume entry point"

    async def resume(self, ctx: AgentContext, point: ResumePoint) -> AgentResult:
        """Play the rest of an episode from ``point`` (its sandbox already restored): send request
        ``point.turn_index`` as recorded, then go on as :meth:`run` would have."""
        raise NotSupportedError(self.resume_refusal(point) or f"agent {self.name!r} cannot resume")
