"""Harbor's task directories as a task kind (:class:`~dressage.rollout.task_kinds.TaskKind`).

Everything rollout needs of Harbor goes through here: a directory dataset is loaded by
:mod:`dressage.harbor.tasks`, its tasks run in the sandbox :mod:`dressage.harbor.sandbox` lays out
(on a root filesystem :mod:`dressage.harbor.rootfs` builds, or an E2B template), under the task's own
agent timeout; the ``harbor`` reward is :mod:`dressage.harbor.verifier`, the ``oracle`` agent
:mod:`dressage.harbor.oracle`. :func:`register` makes it known; the program's top calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dressage.agents import Agent, AgentConfig, Task
from dressage.errors import ConfigError, SandboxError
from dressage.harbor.oracle import OracleAgent
from dressage.harbor.rootfs import cached_rootfs
from dressage.harbor.sandbox import e2b_template, task_spec
from dressage.harbor.tasks import HARBOR, harbor_info, images_for, load_harbor_tasks
from dressage.harbor.verifier import verify
from dressage.paddock import SandboxSpec
from dressage.rollout import task_kinds
from dressage.rollout.task_kinds import RewardFn, RunChoices

PROVIDERS = ("bwrap", "image", "e2b")
"""Sandbox providers that can lay out a Harbor task's paths."""


class HarborKind:
    """The ``harbor`` task kind (see the module docstring)."""

    name = HARBOR

    def reads(self, path: Path) -> bool:
        """A directory is a Harbor dataset (one task directory or a directory of them)."""
        return path.is_dir()

    def load(self, path: Path, limit: int | None, provider: str) -> list[Task]:
        """The dataset's tasks; a task image is a root filesystem, or an E2B template on ``e2b``."""
        return load_harbor_tasks(path, limit, images_for(provider))

    def check(self, tasks: list[Task], run: RunChoices) -> None:
        """Refuse a Harbor dataset scored by a reward that ignores its tests (they would fail or mean
        nothing), in a sandbox that cannot lay out its paths (``local``), or on E2B with a task image
        that no ``sandbox.e2b.templates`` entry maps; and the ``oracle`` agent on tasks without a
        reference solution."""
        harbor = [t for t in tasks if t.kind == HARBOR]
        provider = run.provider
        if harbor and provider not in PROVIDERS:
            raise ConfigError(
                f"the dataset is a Harbor dataset: its tasks run in sandbox provider 'bwrap', 'image' or "
                f"'e2b', not {provider!r} (see docs/harbor.md)"
            )
        if harbor and provider == "e2b":
            for t in harbor:
                e2b_template(_info(t), run.templates, None)
        if harbor and run.reward_kind not in ("harbor", "python"):
            raise ConfigError(
                f"the dataset is a Harbor dataset: use reward kind 'harbor' (its tests/test.sh), not {run.reward_kind!r}"
            )
        if run.agent_kind == "oracle" and len(harbor) < len(tasks):
            raise ConfigError(
                "agent kind 'oracle' runs Harbor tasks' solution/solve.sh; this dataset is not one"
            )

    def snapshot(self, tasks: list[Task]) -> dict[str, Any]:
        """``{"harbor_tasks": {name: {checksum, config}}}`` (``{}`` without Harbor tasks)."""
        out = {
            str(t.id): {"checksum": _info(t)["checksum"], "config": _info(t)["config"]}
            for t in tasks
            if t.kind == HARBOR
        }
        return {"harbor_tasks": out} if out else {}

    def sandbox_spec(self, spec: SandboxSpec, task: Task, templates: Mapping[str, str]) -> SandboxSpec:
        """Harbor's paths, the task's network, env and timeouts, and its built root filesystem on
        bwrap, its built image on ``image`` (a failed build: :class:`SandboxError` with the build's
        error, so the task fails, not the run), or its E2B template from ``sandbox.e2b.templates``."""
        info = _info(task)
        built = info.get("build")
        if built and spec.provider != "e2b":
            if built.get("error") or not built.get("ref"):
                raise SandboxError(str(built.get("error") or f"task {info['name']}: its image was not built"))
            return task_spec(spec, task, None, templates, image=str(built["ref"]))
        rootfs = str(cached_rootfs(info["rootfs"])) if info.get("rootfs") and spec.provider != "e2b" else None
        return task_spec(spec, task, rootfs, templates)

    def artifacts(self, task: Task) -> Mapping[str, bytes]:
        """The build log of the task's image (``build.log``), when it was built here."""
        log = (_info(task).get("build") or {}).get("log")
        path = Path(log) if log else None
        return {"build.log": path.read_bytes()} if path is not None and path.is_file() else {}

    def agent_timeout_s(self, task: Task) -> float | None:
        """The task's ``[agent] timeout_sec``."""
        return float(_info(task)["agent_timeout_s"])

    def agents(self) -> Mapping[str, Callable[[AgentConfig], Agent]]:
        """The ``oracle`` agent (runs the task's ``solution/solve.sh``)."""
        return {"oracle": lambda _cfg: OracleAgent()}

    def rewards(self) -> Mapping[str, RewardFn]:
        """The ``harbor`` reward (the task's ``tests/test.sh`` and reward file)."""
        return {"harbor": verify}


def _info(task: Task) -> dict[str, Any]:
    info = harbor_info(task)
    if info is None:
        raise ConfigError(f"task {task.id or task.index} is not a Harbor task")
    return info


KIND = HarborKind()


def register() -> None:
    """Register the ``harbor`` task kind with rollout (idempotent)."""
    task_kinds.register(KIND)
