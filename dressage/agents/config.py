"""Configuration models of agents: the ``agent:`` section of a rollout config.

One model per ``kind``, joined in a discriminated union (:data:`AgentConfig`), so a typo in a field
or an unknown kind is reported with the exact path of the mistake.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

DOTTED_PATH = re.compile(r"^[A-Za-z_][\w.]*[:.][A-Za-z_]\w*$")


def dotted_path(example: str) -> AfterValidator:
    """A validator of a ``package.module:attr`` string; its error shows ``example``."""

    def check(v: str) -> str:
        if not DOTTED_PATH.match(v):
            raise ValueError(f"{v!r} is not a dotted path like {example!r}")
        return v

    return AfterValidator(check)


class _Strict(BaseModel):
    """Base: unknown fields are errors (a misspelt option must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AnswerAgentConfig(_Strict):
    """Whitebox single-turn agent: one chat completion, its text is the answer."""

    kind: Literal["answer"] = "answer"
    system_prompt: str | None = Field(default=None, description="System message put before the task.")
    rounds: int = Field(
        default=1, ge=1, le=64, description="Replies per episode: after each, the agent asks again."
    )


class CodingAgentConfig(_Strict):
    """Whitebox tool-using agent: loops over shell/file tool calls until it answers."""

    kind: Literal["coding"] = "coding"
    system_prompt: str | None = None
    max_turns: int = Field(default=8, ge=1, le=200, description="LLM calls per episode at most.")
    tool_timeout_s: float = Field(default=30.0, gt=0, description="Default timeout of one shell command.")


class PythonAgentConfig(_Strict):
    """Whitebox agent of your own: ``path`` is ``module:attr`` (a class or an async function)."""

    kind: Literal["python"] = "python"
    path: Annotated[str, dotted_path("mypkg.agents:MyAgent")] = Field(
        description="Dotted path 'package.module:attr' of an Agent subclass or async function."
    )
    options: dict[str, object] = Field(default_factory=dict, description="Keyword arguments for the class.")


class OracleAgentConfig(_Strict):
    """Runs a Harbor task's ``solution/solve.sh`` (no model): checks that a dataset is solvable."""

    kind: Literal["oracle"] = "oracle"


class _BlackboxBase(_Strict):
    """Fields every blackbox adapter shares."""

    env: dict[str, str] = Field(default_factory=dict, description="Extra environment inside the sandbox.")
    answer_file: str = Field(
        default=".dressage/answer.txt",
        description="Workspace file the program may write its final answer to (else its stdout is used).",
    )
    accept_exit_codes: list[int] = Field(
        default_factory=lambda: [0], description="Exit codes that count as success."
    )


class CommandAgentConfig(_BlackboxBase):
    """Any CLI that reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; run inside the sandbox."""

    kind: Literal["command"] = "command"
    command: list[str] | str = Field(
        description="argv list, or a string run with /bin/sh -c. The prompt is in $DRESSAGE_PROMPT."
    )

    @field_validator("command")
    @classmethod
    def _non_empty(cls, v: list[str] | str) -> list[str] | str:
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("command must not be empty")
        return v


class OpenCodeAgentConfig(_BlackboxBase):
    """opencode (``npm install -g --prefix /usr opencode-ai``): opencode.json with an OpenAI-compatible provider."""

    kind: Literal["opencode"] = "opencode"
    binary: str = "opencode"
    extra_args: list[str] = Field(default_factory=list)


class OpenClawAgentConfig(_BlackboxBase):
    """openclaw (needs Node >= 24; ``scripts/install-agents.sh`` installs it with its own node): onboards
    a custom OpenAI-compatible provider, switches memory/search/updates off, then one local turn."""

    kind: Literal["openclaw"] = "openclaw"
    binary: str = "openclaw"
    extra_args: list[str] = Field(default_factory=list)


class ClaudeCodeAgentConfig(_BlackboxBase):
    """Claude Code (``@anthropic-ai/claude-code``): ``claude -p`` against the proxy's Anthropic Messages route."""

    kind: Literal["claude_code"] = "claude_code"
    binary: str = "claude"
    allowed_tools: list[str] = Field(
        default_factory=lambda: ["Bash", "Read", "Write", "Edit", "Glob", "Grep"],
        min_length=1,
        description="Tools Claude Code may use without asking (--allowedTools); others are denied.",
    )
    max_turns: int | None = Field(default=None, ge=1, description="--max-turns: agentic turns at most.")
    extra_args: list[str] = Field(default_factory=list)


class CodexAgentConfig(_BlackboxBase):
    """Codex CLI (``@openai/codex``): ``codex exec`` against the proxy's OpenAI Responses route."""

    kind: Literal["codex"] = "codex"
    binary: str = "codex"
    extra_args: list[str] = Field(default_factory=list)


class QwenCodeAgentConfig(_BlackboxBase):
    """Qwen Code (``@qwen-code/qwen-code``, needs Node >= 22; ``scripts/install-agents.sh`` installs it
    with its own node): ``qwen -p`` against the proxy's OpenAI chat-completions route."""

    kind: Literal["qwen_code"] = "qwen_code"
    binary: str = "qwen"
    max_turns: int | None = Field(default=None, ge=1, description="--max-session-turns: model turns at most.")
    extra_args: list[str] = Field(default_factory=list)


class GeminiCliAgentConfig(_BlackboxBase):
    """Gemini CLI (``@google/gemini-cli``): ``gemini -p`` against the proxy's Gemini API route."""

    kind: Literal["gemini_cli"] = "gemini_cli"
    binary: str = "gemini"
    extra_args: list[str] = Field(default_factory=list)


class MiniSweAgentConfig(_BlackboxBase):
    """mini-swe-agent (PyPI ``mini-swe-agent``, in its own venv by ``scripts/install-agents.sh``): ``mini``
    in yolo mode against the proxy's OpenAI chat-completions route, through litellm's ``openai/`` route."""

    kind: Literal["mini_swe_agent"] = "mini_swe_agent"
    binary: str = "mini-swe-agent"
    step_limit: int = Field(default=0, ge=0, description="agent.step_limit: model calls at most (0: none).")
    extra_args: list[str] = Field(default_factory=list)


BlackboxConfig = (
    CommandAgentConfig
    | OpenCodeAgentConfig
    | OpenClawAgentConfig
    | ClaudeCodeAgentConfig
    | CodexAgentConfig
    | QwenCodeAgentConfig
    | MiniSweAgentConfig
    | GeminiCliAgentConfig
)
"""Any blackbox adapter's config."""

AgentConfig = Annotated[
    AnswerAgentConfig
    | CodingAgentConfig
    | PythonAgentConfig
    | OracleAgentConfig
    | CommandAgentConfig
    | OpenCodeAgentConfig
    | OpenClawAgentConfig
    | ClaudeCodeAgentConfig
    | CodexAgentConfig
    | QwenCodeAgentConfig
    | MiniSweAgentConfig
    | GeminiCliAgentConfig,
    Field(discriminator="kind"),
]
"""The ``agent:`` section: pick one ``kind``."""

WHITEBOX_KINDS = ("answer", "coding", "python", "oracle")
BLACKBOX_KINDS = (
    "command",
    "opencode",
    "openclaw",
    "claude_code",
    "codex",
    "qwen_code",
    "mini_swe_agent",
    "gemini_cli",
)
