"""Task kinds: the typed seam through which a kind of task (Harbor's task directories) plugs into rollout.

Generic rollout knows one kind of its own, ``row`` (a JSONL row: prompt or messages, label, files,
tests). Any other kind implements :class:`TaskKind` and is registered with :func:`register` by the
program's top (``workers/`` and the Ray actors register the built-in ones: :mod:`dressage.harbor.kind`),
so nothing in :mod:`dressage.rollout` imports a kind's package. A :class:`~dressage.agents.Task` says its
kind in its typed ``kind`` field; the hooks below are everything rollout asks of a kind:

- reading a dataset path it recognises (:meth:`TaskKind.reads`, :meth:`TaskKind.load`);
- refusing a run config that cannot run its tasks (:meth:`TaskKind.check` of the :class:`RunChoices`);
- the run snapshot's record of its tasks (:meth:`TaskKind.snapshot`);
- a task's sandbox and agent timeout (:meth:`TaskKind.sandbox_spec`, :meth:`TaskKind.agent_timeout_s`);
- files stored with each of its sessions (:meth:`TaskKind.artifacts`: a task image's build log);
- the agents and rewards it brings (:meth:`TaskKind.agents`, :meth:`TaskKind.rewards`), registered with
  :func:`dressage.agents.register_agent` and :func:`dressage.rollout.rewards.register_reward`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dressage.agents import Agent, AgentConfig, Task, register_agent
from dressage.errors import ConfigError
from dressage.paddock import SandboxSpec
from dressage.rollout.rewards import RewardInput, RewardOutput, register_reward

ROW = "row"
"""The built-in kind: a JSONL row (see :mod:`dressage.rollout.datasets`)."""

RewardFn = Callable[[Any, RewardInput], Awaitable[RewardOutput]]
"""A reward a kind brings: ``await fn(reward_config, inp)``."""


@dataclass(frozen=True)
class RunChoices:
    """What a run config chose that a task kind may refuse: reward, agent, sandbox provider and its
    E2B templates (``sandbox.e2b.templates``)."""

    reward_kind: str
    agent_kind: str
    provider: str = "bwrap"
    templates: Mapping[str, str] = field(default_factory=dict)


class TaskKind(Protocol):
    """What rollout asks of a kind of task (see the module docstring)."""

    name: str
    """The value of :attr:`Task.kind` for this kind's tasks."""

    def reads(self, path: Path) -> bool:
        """Whether dataset ``path`` is this kind's (JSONL files are the ``row`` kind's)."""
        ...

    def load(self, path: Path, limit: int | None, provider: str) -> list[Task]:
        """The tasks of dataset ``path`` numbered from 0, at most ``limit``, for sandbox ``provider``."""
        ...

    def check(self, tasks: list[Task], run: RunChoices) -> None:
        """Raise :class:`ConfigError` when the run's choices cannot run ``tasks`` (all of the dataset's)."""
        ...

    def snapshot(self, tasks: list[Task]) -> dict[str, object]:
        """Entries for the run snapshot about this kind's tasks among ``tasks`` (``{}``: none)."""
        ...

    def sandbox_spec(self, spec: SandboxSpec, task: Task, templates: Mapping[str, str]) -> SandboxSpec:
        """``spec`` adapted to ``task`` (one of this kind's)."""
        ...

    def agent_timeout_s(self, task: Task) -> float | None:
        """The task's own agent timeout, when it has one (the shorter of it and the run's applies)."""
        ...

    def agents(self) -> Mapping[str, Callable[[AgentConfig], Agent]]:
        """Agent kinds this task kind brings (``agent: {kind: ...}``), by name."""
        ...

    def rewards(self) -> Mapping[str, RewardFn]:
        """Reward kinds this task kind brings (``reward: {kind: ...}``), by name."""
        ...

    def artifacts(self, task: Task) -> Mapping[str, bytes]:
        """Files stored with every session of ``task`` (name -> bytes; e.g. its image's build log)."""
        ...


_KINDS: dict[str, TaskKind] = {}


def register(kind: TaskKind) -> None:
    """Make ``kind`` (its tasks, agents and rewards) known to rollout; registering it again is a no-op."""
    if _KINDS.get(kind.name) is kind:
        return
    _KINDS[kind.name] = kind
    for name, build in kind.agents().items():
        register_agent(name, build)
    for name, fn in kind.rewards().items():
        register_reward(name, fn)


def registered() -> list[TaskKind]:
    """The registered kinds, in registration order."""
    return list(_KINDS.values())


def kind_of(task: Task) -> TaskKind | None:
    """The kind of ``task`` (None for a ``row``); an unregistered kind is a :class:`ConfigError`."""
    if task.kind == ROW:
        return None
    kind = _KINDS.get(task.kind)
    if kind is None:
        raise ConfigError(
            f"task {task.id or task.index} is of kind {task.kind!r}, which this process has not registered"
        )
    return kind


def reader_of(path: Path) -> TaskKind | None:
    """The registered kind that reads dataset ``path``, else None (a JSONL file)."""
    return next((k for k in _KINDS.values() if k.reads(path)), None)


def snapshot(tasks: list[Task]) -> dict[str, object]:
    """The run snapshot's entries of every registered kind (``{}`` for a JSONL dataset)."""
    out: dict[str, object] = {}
    for kind in _KINDS.values():
        out.update(kind.snapshot(tasks))
    return out


def sandbox_spec(spec: SandboxSpec, task: Task, templates: Mapping[str, str] | None = None) -> SandboxSpec:
    """``spec`` for ``task``: adapted by its kind, unchanged for a ``row``."""
    kind = kind_of(task)
    return spec if kind is None else kind.sandbox_spec(spec, task, templates or {})


def artifacts(task: Task) -> dict[str, bytes]:
    """The files ``task``'s kind stores with each of its sessions (``{}`` for a ``row``)."""
    kind = kind_of(task)
    return {} if kind is None else dict(kind.artifacts(task))


def agent_timeout_s(task: Task, run_timeout_s: float) -> float:
    """The agent timeout of ``task``: the run's, or its kind's when shorter."""
    kind = kind_of(task)
    own = None if kind is None else kind.agent_timeout_s(task)
    return run_timeout_s if own is None else min(run_timeout_s, own)
