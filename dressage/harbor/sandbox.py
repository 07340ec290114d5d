"""The sandbox of a Harbor task: Harbor's fixed paths mapped onto our sandbox's workspace.

Harbor tasks address absolute paths: the working directory (``WORKDIR``, default ``/app``), ``/tests``
(copied in by the verifier), ``/logs/verifier/reward.txt`` (written by ``test.sh``) and ``/solution``
(the oracle's). Here each is a directory of the session's workspace bound at that path
(:attr:`~dressage.paddock.SandboxSpec.mounts`): the working directory *is* the workspace, and the
others live under ``.harbor/`` in it, where the host reads and writes them through the sandbox's
file methods. ``/tests`` stays empty until the agent has ended, and the verifier empties ``/tests``
and ``/logs/verifier`` before it writes the tests, so nothing the agent left there counts.

The same spec serves both providers that run Harbor tasks; only how a mount is realised differs:
bubblewrap binds each workspace directory at its path, E2B (a VM with its own filesystem) makes the
task's working directory the workspace and each other path a symlink into it (see
:mod:`dressage.paddock.e2b`). The verifier and the oracle read and write the same workspace paths on
both. A task image is a Debian root filesystem on bubblewrap and an E2B template on E2B
(:func:`e2b_template`: ``sandbox.e2b.templates`` maps the task's name or ``docker_image``; a task
with an image and no entry is refused, naming the task, never run on another template).

Internet: a task that allows it (Harbor's default) gets it only when the run's ``sandbox.network``
is on; otherwise it is refused (the sandbox has no network), and the session records that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dressage.agents.base import Task
from dressage.errors import ConfigError
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


def task_image(info: Mapping[str, object]) -> dict[str, Any] | None:
    """The task's image (``{"kind": "dockerfile"|"docker_image", "ref": ...}``), None when image-less."""
    image = info.get("image")
    if isinstance(image, dict):
        return image
    return {"kind": "dockerfile", "ref": None} if info.get("rootfs") else None  # tasks loaded before "image"


def e2b_template(info: Mapping[str, object], templates: Mapping[str, str], default: str | None) -> str | None:
    """The E2B template of a Harbor task: ``default`` when image-less, else its mapping, else refused."""
    image = task_image(info)
    if image is None:
        return default
    name = str(info["name"])
    for key in (name, image.get("ref")):
        if key and key in templates:
            return templates[key]
    what = "environment/Dockerfile" if image["kind"] == "dockerfile" else f"docker_image {image['ref']!r}"
    raise ConfigError(
        f"task {name}: its {what} needs an E2B template: build one from the task's Dockerfile "
        f"(`e2b template build`, docs/harbor.md) and map it in sandbox.e2b.templates "
        f"({name!r}{' or ' + repr(image['ref']) if image.get('ref') else ''}: TEMPLATE_ID)"
    )


def task_spec(
    spec: SandboxSpec,
    task: Task,
    rootfs: str | None = None,
    templates: Mapping[str, str] | None = None,
    image: str | None = None,
) -> SandboxSpec:
    """``spec`` adapted to a Harbor task (mounts, network, env, timeouts, root filesystem, image or template).

    On ``e2b`` the working directory is always one of the mounts (it becomes the VM's workspace) and
    the template comes from :func:`e2b_template`; elsewhere ``rootfs`` is the built root filesystem
    and ``image`` the built task image (the ``image`` provider); a task with neither keeps the run's
    ``sandbox.image``, one with a root filesystem runs without it.
    """
    info = harbor_info(task)
    if info is None:
        return spec
    longest = max(float(info["verifier_timeout_s"]), float(info["agent_timeout_s"]), spec.max_timeout_s)
    workdir = str(info["workdir"])
    mounts = harbor_mounts(workdir)
    template = spec.template
    if spec.provider == "e2b":
        if workdir.rstrip("/") == "":
            raise ConfigError(
                f"task {info['name']}: workdir '/' cannot be an E2B workspace (it is the VM's root)"
            )
        mounts[workdir.rstrip("/")] = "."
        template, rootfs = e2b_template(info, templates or {}, spec.template), None
    return dataclasses.replace(
        spec,
        mounts=mounts,
        network=spec.network and bool(info["wants_internet"]),
        env={**dict(info.get("env") or {}), **dict(spec.env)},
        max_timeout_s=longest,
        rootfs=rootfs,
        image=image or (None if rootfs else spec.image),
        template=template,
    )


def internet_note(spec_network: bool, info: dict[str, object]) -> str:
    """How the task's internet wish was honoured: ``granted``, ``refused`` or ``not wanted``."""
    if not info.get("wants_internet"):
        return "not wanted"
    return "granted" if spec_network else "refused"
