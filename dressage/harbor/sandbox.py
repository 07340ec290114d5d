"""The sandbox of a Harbor task: Harbor's fixed paths mapped onto our bubblewrap workspace.

Harbor tasks address absolute paths: the working directory (``WORKDIR``, default ``/app``), ``/tests``
(copied in by the verifier), ``/logs/verifier/reward.txt`` (written by ``test.sh``) and ``/solution``
(the oracle's). Here each is a directory of the session's workspace bound at that path
(:attr:`~dressage.paddock.SandboxSpec.mounts`): the working directory *is* the workspace, and the
others live under ``.harbor/`` in it, where the host reads and writes them through the sandbox's
file methods. ``/tests`` stays empty until the agent has ended, and the verifier empties ``/tests``
and ``/logs/verifier`` before it writes the tests, so nothing the agent left there counts.

Internet: a task that allows it (Harbor's default) gets it only when the run's ``sandbox.network``
is on; otherwise it is refused (the sandbox has no network), and the session records that.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dressage.agents.base import Task
from dressage.harbor.tasks import harbor_info
from dressage.paddock.base import WORKSPACE_MOUNT, SandboxSpec

HARBOR_DIR = ".harbor"
TESTS_DIR = f"{HARBOR_DIR}/tests"
LOGS_DIR = f"{HARBOR_DIR}/logs"
SOLUTION_DIR = f"{HARBOR_DIR}/solution"
VERIFIER_LOGS = f"{LOGS_DIR}/verifier"


def harbor_mounts(workdir: str) -> dict[str, str]:
    """In-sandbox path -> workspace directory, for a task whose working directory is ``workdir``."""
    mounts = {"/tests": TESTS_DIR, "/logs": LOGS_DIR, "/solution": SOLUTION_DIR}
    if workdir.rstrip("/") != WORKSPACE_MOUNT:
        mounts[workdir.rstrip("/") or "/"] = "."
    return mounts


def task_spec(spec: SandboxSpec, task: Task, rootfs: str | None = None) -> SandboxSpec:
    """``spec`` adapted to a Harbor task (mounts, network, env, timeouts, root filesystem)."""
    info = harbor_info(task)
    if info is None:
        return spec
    longest = max(float(info["verifier_timeout_s"]), float(info["agent_timeout_s"]), spec.max_timeout_s)
    return dataclasses.replace(
        spec,
        mounts=harbor_mounts(str(info["workdir"])),
        network=spec.network and bool(info["wants_internet"]),
        env={**dict(info.get("env") or {}), **dict(spec.env)},
        max_timeout_s=longest,
        rootfs=rootfs,
    )


def internet_note(spec_network: bool, info: dict[str, Any]) -> str:
    """How the task's internet wish was honoured: ``granted``, ``refused`` or ``not wanted``."""
    if not info.get("wants_internet"):
        return "not wanted"
    return "granted" if spec_network else "refused"
