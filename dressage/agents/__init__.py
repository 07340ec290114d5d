"""Agents: whitebox (Python code using an OpenAI client bound to its proxy session) and blackbox
(existing agent programs run inside the sandbox). :func:`build_agent` turns an ``agent:`` config
section into an :class:`Agent`.
"""

from __future__ import annotations

from collections.abc import Callable

from dressage.agents.base import Agent, AgentContext, AgentLog, AgentResult, ResumePoint, Task
from dressage.agents.blackbox import BlackboxAgent, CommandAgent, OpenClawAgent, OpenCodeAgent
from dressage.agents.config import (
    BLACKBOX_KINDS,
    WHITEBOX_KINDS,
    AgentConfig,
    AnswerAgentConfig,
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    CodingAgentConfig,
    CommandAgentConfig,
    GeminiCliAgentConfig,
    MiniSweAgentConfig,
    OpenClawAgentConfig,
    OpenCodeAgentConfig,
    OracleAgentConfig,
    PythonAgentConfig,
    QwenCodeAgentConfig,
)
from dressage.agents.native_clis import (
    ClaudeCodeAgent,
    CodexAgent,
    GeminiCliAgent,
    MiniSweAgent,
    QwenCodeAgent,
)
from dressage.agents.whitebox import AnswerAgent, CodingAgent, FunctionAgent, load_python_agent
from dressage.errors import ConfigError, NotSupportedError

_REGISTERED: dict[str, Callable[[AgentConfig], Agent]] = {}


def register_agent(kind: str, build: Callable[[AgentConfig], Agent]) -> None:
    """Build agent kind ``kind`` with ``build``: the agents a task kind brings (Harbor's ``oracle``),
    registered by :func:`dressage.rollout.task_kinds.register`."""
    _REGISTERED[kind] = build


def build_agent(cfg: AgentConfig) -> Agent:
    """The agent for a validated ``agent:`` section (python paths are imported here)."""
    if cfg.kind in _REGISTERED:
        return _REGISTERED[cfg.kind](cfg)
    if isinstance(cfg, AnswerAgentConfig):
        return AnswerAgent(cfg.system_prompt, cfg.rounds)
    if isinstance(cfg, CodingAgentConfig):
        return CodingAgent(cfg.system_prompt, cfg.max_turns, cfg.tool_timeout_s)
    if isinstance(cfg, PythonAgentConfig):
        return load_python_agent(cfg.path, dict(cfg.options))
    if isinstance(cfg, OracleAgentConfig):
        raise ConfigError(
            "agent kind 'oracle' runs Harbor tasks: this process has not registered the harbor task kind"
        )
    if isinstance(cfg, CommandAgentConfig):
        return CommandAgent(cfg)
    if isinstance(cfg, OpenCodeAgentConfig):
        return OpenCodeAgent(cfg)
    if isinstance(cfg, OpenClawAgentConfig):
        return OpenClawAgent(cfg)
    if isinstance(cfg, ClaudeCodeAgentConfig):
        return ClaudeCodeAgent(cfg)
    if isinstance(cfg, CodexAgentConfig):
        return CodexAgent(cfg)
    if isinstance(cfg, QwenCodeAgentConfig):
        return QwenCodeAgent(cfg)
    if isinstance(cfg, MiniSweAgentConfig):
        return MiniSweAgent(cfg)
    if isinstance(cfg, GeminiCliAgentConfig):
        return GeminiCliAgent(cfg)
    raise NotSupportedError(f"agent kind {getattr(cfg, 'kind', cfg)!r} is not supported yet")


__all__ = [
    "BLACKBOX_KINDS",
    "WHITEBOX_KINDS",
    "Agent",
    "AgentConfig",
    "AgentContext",
    "AgentLog",
    "AgentResult",
    "AnswerAgent",
    "BlackboxAgent",
    "ClaudeCodeAgent",
    "CodexAgent",
    "CodingAgent",
    "CommandAgent",
    "FunctionAgent",
    "GeminiCliAgent",
    "MiniSweAgent",
    "OpenClawAgent",
    "OpenCodeAgent",
    "QwenCodeAgent",
    "ResumePoint",
    "Task",
    "build_agent",
    "load_python_agent",
    "register_agent",
]
