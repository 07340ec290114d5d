"""A Harbor task's ``environment/docker-compose.yaml``, run as far as one service goes.

Harbor (and terminal-bench) start a task's container with Docker Compose. Here a compose file with
exactly one service is read into the task's ``[environment]`` settings: its ``build`` (the task's
``environment/`` directory as the context, any ``dockerfile`` in it) or ``image`` (a prebuilt
``docker_image``), its ``environment`` (the task's env) and ``working_dir``. ``container_name``, a
keep-alive ``command``/``entrypoint`` (the sandbox runs no long-lived process of its own), ``tty``,
``stdin_open`` and ``init`` change nothing here and are accepted. Anything beyond that (a second
service, ``volumes``, ``ports``, ``networks``, ``depends_on``, healthchecks, resources, a build
context outside ``environment/``, build arguments, ...) is refused, naming the task and the field:
it is never approximated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dressage.errors import ConfigError

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_INERT = ("container_name", "command", "entrypoint", "tty", "stdin_open", "init")
"""Service fields that change nothing for a sandbox that runs the task's commands one by one."""
_CONTEXTS = (".", "./", "${CONTEXT_DIR}", "$CONTEXT_DIR")
"""Build contexts that are the task's ``environment/`` directory (Harbor sets ``CONTEXT_DIR`` to it)."""


def _field(task: str, name: str) -> ConfigError:
    return ConfigError(
        f"task {task}: environment/docker-compose.yaml: {name} is refused: only one service's build or "
        "image, environment and working_dir run here (see docs/harbor.md)"
    )


def _env(task: str, service: str, value: Any) -> dict[str, str]:
    """A service's ``environment`` (a mapping, or a list of ``KEY=VALUE``)."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise _field(task, f"services.{service}.environment entry {item!r} (no value)")
            out[key] = val
        return out
    raise _field(task, f"services.{service}.environment of type {type(value).__name__}")


def _build(task: str, service: str, value: Any) -> str:
    """The Dockerfile name of a service's ``build`` (its context must be ``environment/``)."""
    spec = {"context": value} if isinstance(value, str) else value
    if not isinstance(spec, dict):
        raise _field(task, f"services.{service}.build")
    for key in spec:
        if key not in ("context", "dockerfile"):
            raise _field(task, f"services.{service}.build.{key}")
    if str(spec.get("context", ".")) not in _CONTEXTS:
        raise _field(task, f"services.{service}.build.context {spec['context']!r} (not environment/)")
    dockerfile = str(spec.get("dockerfile") or "Dockerfile")
    if "/" in dockerfile or dockerfile.startswith("."):
        raise _field(task, f"services.{service}.build.dockerfile {dockerfile!r} (not a file of environment/)")
    return dockerfile


def compose_environment(task: str, env_dir: Path, images: str) -> dict[str, Any]:
    """The ``[environment]`` settings the task's compose file makes (``{}`` without one); refused
    beyond one service, and on E2B (``images == "template"``: templates come from Dockerfiles)."""
    found = [env_dir / n for n in COMPOSE_FILES if (env_dir / n).is_file()]
    if not found:
        return {}
    if images == "template":
        raise ConfigError(
            f"task {task}: environment/{found[0].name} cannot be honoured on E2B (see docs/harbor.md)"
        )
    try:
        data = yaml.safe_load(found[0].read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"task {task}: environment/{found[0].name} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ConfigError(f"task {task}: environment/{found[0].name} has no services")
    for key in data:
        if key not in ("services", "version", "name"):
            raise _field(task, key)
    services = data["services"]
    if len(services) != 1:
        raise _field(task, f"services ({len(services)} services: {', '.join(map(str, services))})")
    (service, spec) = next(iter(services.items()))
    out: dict[str, Any] = {}
    for key, value in dict(spec or {}).items():
        if key == "build":
            out["dockerfile"] = _build(task, service, value)
        elif key == "environment":
            out["env"] = _env(task, service, value)
        elif key == "working_dir":
            out["workdir"] = str(value)
        elif key == "image" or key in _INERT:
            continue
        else:
            raise _field(task, f"services.{service}.{key}")
    if "dockerfile" not in out and spec.get("image"):
        out["docker_image"] = str(spec["image"])
    return out
