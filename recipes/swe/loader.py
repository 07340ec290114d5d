"""SWE-bench / SWE-Gym records as tasks, and the ``swe`` task kind that lays out their checkout.

``dataset.loader: recipes.swe.loader:load_tasks`` reads the records (:mod:`recipes.swe.records`),
finds each repository (:func:`recipes.swe.checkout.repo_source`), makes its checkout at
``base_commit`` (so a missing repository or commit stops the run before it starts), and returns one
:class:`~dressage.agents.Task` per instance: the issue as the prompt, the record and the
repository's source under ``metadata["swe"]`` (what a resumed run or another worker needs; the
checkout is rebuilt from the source where it is missing).

The environment is the repository: every agent kind, the blackbox CLIs included, starts in a
sandbox whose workspace is the checkout (``.git`` included, no later history). Rollout gives a task
kind that hook (:meth:`SweKind.sandbox_spec`), so this module registers the ``swe`` kind with
rollout when it is imported: by the loader, and by the reward (:mod:`recipes.swe.reward` imports
this module), so every process that runs SWE episodes has it. On ``bwrap`` and ``e2b`` the workspace
is also mounted at ``/testbed``, where SWE-bench's images and eval scripts keep the repository.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from dressage.agents import Agent, AgentConfig, Task
from dressage.errors import ConfigError
from dressage.paddock import SandboxSpec
from dressage.rollout import task_kinds
from dressage.rollout.task_kinds import RewardFn, RunChoices
from recipes.extras import require
from recipes.swe.checkout import prepare_checkout, repo_source, workspace_files
from recipes.swe.records import SweRecord, read_records

KIND = "swe"
TESTBED = "/testbed"

PROMPT = """{problem}

The repository {repo} is checked out in the current directory at the commit the issue was reported
against. Change the code so that the issue is resolved. Do not modify the tests or the test
configuration: the project's tests grade your change, and a change to them scores 0."""


def task_of(record: SweRecord, index: int, source: str) -> Task:
    """The task of one instance (see the module docstring)."""
    return Task(
        index=index,
        id=record.instance_id,
        kind=KIND,
        prompt=PROMPT.format(problem=record.problem_statement.strip(), repo=record.repo),
        metadata={KIND: {"record": record.model_dump(mode="json", exclude_none=True), "source": source}},
    )


def load_tasks(path: Path, limit: int | None) -> list[Task]:
    """``dataset.loader``: the instances of ``path`` as tasks, their checkouts made."""
    require("swebench", "swe")  # before any checkout: a missing extra, named
    records = read_records(path, limit)
    tasks = []
    for i, record in enumerate(records):
        source = repo_source(record, Path(path).parent)
        prepare_checkout(record, source)
        tasks.append(task_of(record, i, source))
    return tasks


def record_of(task: Task) -> SweRecord:
    """The record a ``swe`` task carries; a task of another kind is a :class:`ConfigError`."""
    data = task.metadata.get(KIND)
    if task.kind != KIND or not isinstance(data, dict):
        raise ConfigError(
            f"task {task.id or task.index} is not a SWE instance (dataset.loader: recipes.swe.loader:load_tasks)"
        )
    return SweRecord.model_validate(data["record"])


class SweKind:
    """The ``swe`` task kind: the checkout as the workspace (see the module docstring)."""

    name = KIND

    def reads(self, path: Path) -> bool:
        """Never by path: SWE records are read by ``dataset.loader``."""
        return False

    def load(self, path: Path, limit: int | None, provider: str) -> list[Task]:
        """The instances of ``path`` (:func:`load_tasks`)."""
        return load_tasks(path, limit)

    def check(self, tasks: list[Task], run: RunChoices) -> None:
        """Refuse a reward that does not grade SWE instances: the tests are the reward."""
        if any(t.kind == KIND for t in tasks) and run.reward_kind != "python":
            raise ConfigError(
                "the dataset holds SWE instances: grade them with reward kind 'python', "
                f"path recipes.swe.reward:score, not {run.reward_kind!r}"
            )

    def snapshot(self, tasks: list[Task]) -> dict[str, object]:
        """``{"swe_instances": {instance_id: base_commit}}``."""
        out = {str(t.id): record_of(t).base_commit for t in tasks if t.kind == KIND}
        return {"swe_instances": out} if out else {}

    def sandbox_spec(self, spec: SandboxSpec, task: Task, templates: Mapping[str, str]) -> SandboxSpec:
        """The checkout as the workspace's files, mounted at ``/testbed`` too on bwrap and e2b."""
        record = record_of(task)
        checkout = prepare_checkout(record, str(task.metadata[KIND]["source"]))
        mounts = {**spec.mounts, TESTBED: "."} if spec.provider in ("bwrap", "e2b") else dict(spec.mounts)
        return dataclasses.replace(spec, files={**spec.files, **workspace_files(checkout)}, mounts=mounts)

    def agent_timeout_s(self, task: Task) -> float | None:
        """The run's timeout applies."""
        return None

    def agents(self) -> Mapping[str, Callable[[AgentConfig], Agent]]:
        """None: the agents are ``python`` agents (:mod:`recipes.swe.agent`) and the built-in CLIs."""
        return {}

    def rewards(self) -> Mapping[str, RewardFn]:
        """None: the reward is the ``python`` reward :func:`recipes.swe.reward.score`."""
        return {}

    def artifacts(self, task: Task) -> Mapping[str, bytes]:
        """None: a prepared checkout has no build log to store with its sessions."""
        return {}


SWE_KIND = SweKind()
task_kinds.register(SWE_KIND)
