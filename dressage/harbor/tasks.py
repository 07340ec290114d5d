"""Harbor task directories as a dataset: ``task.toml`` + ``instruction.md`` + ``tests/`` + ``solution/``.

A dataset is one task directory (it has a ``task.toml``) or a directory of them (sorted by name).
Each task becomes a :class:`~dressage.agents.Task`: the prompt is ``instruction.md``, ``tests`` are
the files of ``tests/`` (written into the sandbox only when the verifier runs, so the agent never
sees them), and ``metadata["harbor"]`` holds what the sandbox, the verifier and the oracle need:
the task's name, checksum (sha256 over its files) and parsed ``task.toml``, the working directory,
timeouts, the verifier mode, the solution files and the root-filesystem plan of its Dockerfile.

With Harbor importable (the ``harbor`` extra, Python 3.12) every task is also loaded by Harbor's own
``Task`` model, so a directory Harbor rejects is rejected here too. Without it, this reader parses
``task.toml`` itself and refuses what it cannot honour (multi-step tasks, Windows, GPUs/TPUs,
MCP servers, a verifier image of its own), naming the task and the field. A task image is a Debian
root filesystem for an apt-only Dockerfile (bubblewrap, the fast path), an image built as written
(any other Dockerfile, or a ``docker_image``, on the ``image`` provider: :mod:`dressage.harbor.build`),
or an E2B template; a compose file runs as far as one service goes (:mod:`dressage.harbor.compose`). On E2B a task image (any Dockerfile, or ``docker_image``) is an E2B
template chosen by the run config (:func:`dressage.harbor.sandbox.e2b_template`). Everything read must be UTF-8 text: the task payload is JSON in the log.
"""

from __future__ import annotations

import hashlib
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dressage.agents.base import Task
from dressage.errors import ConfigError
from dressage.harbor import build
from dressage.harbor.compose import compose_environment
from dressage.harbor.dockerfile import parse_dockerfile, rootfs_key, rootfs_plan

HARBOR = "harbor"
"""The task kind of a Harbor task (:attr:`Task.kind`), and the key of its data in ``Task.metadata``."""
DEFAULT_WORKDIR = "/app"
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
_CANARY = "canary GUID"
NETWORK_MODES = ("public", "no-network", "allowlist")
_META_ORDER = (
    "name", "checksum", "config", "workdir", "env", "wants_internet", "agent_timeout_s", "verifier_timeout_s",
    "verifier_env", "verifier_mode", "solution", "solution_env", "rootfs", "image", "build", "ignored",
)  # fmt: skip
"""The keys of ``metadata["harbor"]``, in order."""


def is_task_dir(path: Path) -> bool:
    """True when ``path`` holds a ``task.toml`` (a Harbor task directory)."""
    return (path / "task.toml").is_file()


def is_harbor_dataset(path: str | Path) -> bool:
    """True when ``path`` is a Harbor task directory or a directory containing task directories."""
    p = Path(path)
    return p.is_dir() and (is_task_dir(p) or any(is_task_dir(c) for c in p.iterdir() if c.is_dir()))


def task_dirs(path: str | Path) -> list[Path]:
    """The task directories of a dataset path, sorted by name."""
    p = Path(path)
    if is_task_dir(p):
        return [p]
    dirs = sorted(c for c in p.iterdir() if c.is_dir() and is_task_dir(c))
    if not dirs:
        raise ConfigError(f"{p} holds no Harbor task directory (a folder with task.toml)")
    return dirs


def _read_text(task: str, path: Path, root: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"task {task}: {path.relative_to(root)} is not UTF-8 text; binary task files are not supported"
        ) from None


def _files_under(task: str, directory: Path, root: Path) -> dict[str, str]:
    """``{relative path: text}`` of every file under ``directory`` (symlinks out of the task refused)."""
    if not directory.is_dir():
        return {}
    out: dict[str, str] = {}
    for f in sorted(directory.rglob("*")):
        if f.is_symlink() and root.resolve() not in f.resolve().parents:
            raise ConfigError(f"task {task}: {f.relative_to(root)} links outside the task directory")
        if f.is_file():
            out[f.relative_to(directory).as_posix()] = _read_text(task, f, root)
    return out


def task_checksum(task_dir: Path) -> str:
    """sha256 over the task's files (relative path and bytes, sorted): changes when any file does."""
    h = hashlib.sha256()
    for f in sorted(p for p in task_dir.rglob("*") if p.is_file()):
        h.update(f.relative_to(task_dir).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _harbor_validate(task_dir: Path) -> str | None:
    """Load the task with Harbor's own model when Harbor is importable; its name, else None."""
    try:
        from harbor.models.task.task import Task as HarborTask  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        return str(HarborTask(task_dir).name)
    except Exception as e:  # Harbor's loader raises many kinds; each is a bad task directory
        raise ConfigError(f"task {task_dir.name}: Harbor rejects it: {type(e).__name__}: {e}") from None


def _refuse(task: str, what: str) -> ConfigError:
    return ConfigError(f"task {task}: {what} cannot be honoured here (see docs/harbor.md)")


def _dockerfile_workdir_env(text: str) -> tuple[str | None, dict[str, str]]:
    """The last absolute ``WORKDIR`` and the ``ENV`` settings of a Dockerfile (the rest not judged).

    For a task image that is an E2B template: its commands run from that directory with that
    environment, as in the container Harbor would build (``$VAR`` references are left as written).
    """
    workdir: str | None = None
    env: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) != 2:
            continue
        instr, rest = parts[0].upper(), parts[1].strip()
        if instr == "WORKDIR" and rest.startswith("/"):
            workdir = rest
        elif instr == "ENV":
            try:
                words = shlex.split(rest)
            except ValueError:
                continue
            if words and all("=" in w for w in words):
                for word in words:
                    key, value = word.split("=", 1)
                    env[key] = value
            elif len(words) >= 2:
                env[words[0]] = " ".join(words[1:])
    return workdir, env


def load_task(task_dir: Path, index: int, images: str = "rootfs") -> Task:
    """One Harbor task directory as a :class:`Task` (see the module docstring).

    ``images`` says what a task image becomes: ``rootfs`` (bubblewrap: a whitelisted Dockerfile's
    Debian root filesystem, anything else refused) or ``template`` (E2B: the image is an E2B template
    built from the task's Dockerfile, or the ``docker_image``, chosen by the run config; the
    Dockerfile is not judged here, its ``WORKDIR`` and ``ENV`` are read, its ``COPY``s are in the template).
    """
    name, config = _task_config(task_dir)
    env_cfg = dict(config.get("environment") or {})
    instruction_path = task_dir / "instruction.md"
    if not instruction_path.is_file():
        raise ConfigError(f"task {name}: instruction.md is missing")
    instruction = "\n".join(
        ln for ln in _read_text(name, instruction_path, task_dir).splitlines() if _CANARY not in ln
    ).strip()
    tests = _files_under(name, task_dir / "tests", task_dir)
    if "test.sh" not in tests:
        raise ConfigError(f"task {name}: tests/test.sh is missing (the verifier runs it)")
    solution = _files_under(name, task_dir / "solution", task_dir)
    env_dir = task_dir / "environment"
    compose = compose_environment(name, env_dir, images)
    picked: dict[str, Any] = {k: compose[k] for k in ("dockerfile", "docker_image") if k in compose}
    image = _environment(name, task_dir, {**env_cfg, **picked}, images)
    image.env.update(compose.get("env") or {})
    image.workdir = str(compose.get("workdir") or image.workdir)
    settings = _settings(name, config, image.workdir, image.env)
    meta = {"name": name, "checksum": task_checksum(task_dir), "config": config, **settings}
    meta.update(solution=solution, rootfs=image.rootfs, image=image.image, build=image.build)
    meta = {k: meta[k] for k in _META_ORDER}  # the order the payload has always had
    return Task(
        index=index,
        id=name,
        prompt=instruction,
        files=image.files,
        tests=tests,
        metadata={HARBOR: meta},
        kind=HARBOR,
    )


def _task_config(task_dir: Path) -> tuple[str, dict[str, Any]]:
    """The task's name and parsed ``task.toml``; what this reader cannot honour is refused."""
    name = _harbor_validate(task_dir) or task_dir.name
    try:
        config: dict[str, Any] = tomllib.loads(_read_text(name, task_dir / "task.toml", task_dir))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"task {name}: task.toml is not valid TOML: {e}") from None
    if isinstance(config.get("task"), dict) and config["task"].get("name"):
        name = str(config["task"]["name"])
    env_cfg = dict(config.get("environment") or {})
    if config.get("steps"):
        raise _refuse(name, "a multi-step task ([[steps]])")
    if str(env_cfg.get("os", "linux")).lower() != "linux":
        raise _refuse(name, f"environment.os = {env_cfg['os']!r}")
    for key in ("gpus", "tpu", "mcp_servers"):
        if env_cfg.get(key):
            raise _refuse(name, f"environment.{key}")
    if dict(config.get("verifier") or {}).get("environment"):
        raise _refuse(name, "a verifier environment of its own ([verifier.environment])")
    return name, config


@dataclass
class _Environment:
    """What a task's ``environment/`` makes: workspace seed files, root-filesystem plan, image, workdir, env."""

    files: dict[str, str] = field(default_factory=dict)
    rootfs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    build: dict[str, Any] | None = None
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)


def _environment(name: str, task_dir: Path, env_cfg: dict[str, Any], images: str) -> _Environment:
    """The task image as a root-filesystem plan (``rootfs``), a built image (``build``: any Dockerfile,
    or a ``docker_image``, for the ``image`` provider) or an E2B template reference (``template``)."""
    out = _Environment()
    env_dir = task_dir / "environment"
    dockerfile = env_dir / str(env_cfg.get("dockerfile") or "Dockerfile")
    if dockerfile.is_file():
        out.image = {"kind": "dockerfile", "ref": None}
    elif env_cfg.get("docker_image"):
        out.image = {"kind": "docker_image", "ref": str(env_cfg["docker_image"])}
    if images == "template":
        if out.image is not None and out.image["kind"] == "dockerfile":
            found, dockerfile_env = _dockerfile_workdir_env(_read_text(name, dockerfile, task_dir))
            out.workdir = found or DEFAULT_WORKDIR
            out.env.update(dockerfile_env)
    elif dockerfile.is_file():
        text = _read_text(name, dockerfile, task_dir)
        try:
            plan = parse_dockerfile(name, text)
        except ConfigError as e:
            if images != "build":
                raise ConfigError(
                    f"{e}; with sandbox.provider: image any Dockerfile is built as written (docs/harbor.md)"
                ) from None
            _built(out, name, build.build(name, text, env_dir, dockerfile.name))
            return out
        out.workdir = plan.workdir or DEFAULT_WORKDIR
        out.env.update(plan.env)
        out.files = _workspace_copies(name, task_dir, plan.copies, out.workdir)
        full = rootfs_plan(plan, env_dir)  # the key is taken now: episodes need no task directory
        out.rootfs = {**{k: v for k, v in full.items() if k != "context"}, "key": rootfs_key(full)}
    elif env_cfg.get("docker_image") and images == "build":
        ref = build.prebuilt(name, str(env_cfg["docker_image"]))
        _built(out, name, build.Built(None, ref, None))
    elif env_cfg.get("docker_image"):
        raise _refuse(
            name,
            f"the prebuilt image {env_cfg['docker_image']!r} (no image is pulled here; run it with "
            "sandbox.provider: image, on sandbox provider e2b from a template built from it, or with Harbor's own environments)",
        )
    if out.image is None:  # image-less: environment/ is the working directory's initial content
        placed = _files_under(name, env_dir, task_dir)
        out.files.update({k: v for k, v in placed.items() if Path(k).name != ".gitkeep"})  # git's placeholder
    return out


def _built(out: _Environment, name: str, built: build.Built) -> None:
    """A built task image: its reference (or build error) and log; the workdir is the image's own."""
    out.build = {"key": built.key, "ref": built.ref, "log": built.log, "error": built.error}
    workdir = build.image_workdir(built.ref) if built.ref else None
    out.workdir = workdir or DEFAULT_WORKDIR


def _workspace_copies(
    name: str, task_dir: Path, copies: list[tuple[str, str]], workdir: str
) -> dict[str, str]:
    """The Dockerfile's ``COPY``s into the workdir, as workspace seed files (the workdir is the workspace)."""
    env_dir = task_dir / "environment"
    files: dict[str, str] = {}
    for src, dst in copies:
        source = (env_dir / src).resolve()
        if env_dir.resolve() not in source.parents or not source.exists():
            raise ConfigError(f"task {name}: COPY source {src!r} is not a file of environment/")
        if dst.rstrip("/") == workdir.rstrip("/") or dst.startswith(workdir.rstrip("/") + "/"):
            rel = dst[len(workdir) :].strip("/")
            if source.is_dir():
                for k, v in _files_under(name, source, task_dir).items():
                    files[f"{rel}/{k}".lstrip("/")] = v
            else:
                target = rel if rel and not dst.endswith("/") else f"{rel}/{source.name}".lstrip("/")
                files[target] = _read_text(name, source, task_dir)
    return files


def _settings(name: str, config: dict[str, Any], workdir: str, env: dict[str, str]) -> dict[str, Any]:
    """The task's working directory, env, network wish, timeouts, verifier and solution settings."""
    env_cfg = dict(config.get("environment") or {})
    agent_cfg = dict(config.get("agent") or {})
    verifier_cfg = dict(config.get("verifier") or {})
    env = {**env, **{str(k): str(v) for k, v in dict(env_cfg.get("env") or {}).items()}}
    allow_internet = env_cfg.get("allow_internet")
    network_mode = str(env_cfg.get("network_mode") or "public")
    if network_mode not in NETWORK_MODES:
        raise ConfigError(
            f"task {name}: environment.network_mode {network_mode!r} is not one of {NETWORK_MODES}"
        )
    # An allowlist cannot be enforced by the sandbox (network is all or nothing): it gets none.
    wants_internet = bool(allow_internet) if allow_internet is not None else network_mode == "public"
    mode = verifier_cfg.get("environment_mode") or "shared"
    ignored = [f"environment.{k}" for k in ("cpus", "memory_mb", "storage_mb", "healthcheck") if k in env_cfg]
    return {
        "workdir": str(env_cfg.get("workdir") or workdir),
        "env": env,
        "wants_internet": wants_internet,
        "agent_timeout_s": float(agent_cfg.get("timeout_sec") or DEFAULT_AGENT_TIMEOUT_S),
        "verifier_timeout_s": float(verifier_cfg.get("timeout_sec") or DEFAULT_VERIFIER_TIMEOUT_S),
        "verifier_env": {str(k): str(v) for k, v in dict(verifier_cfg.get("env") or {}).items()},
        "verifier_mode": str(mode),
        "solution_env": {
            str(k): str(v) for k, v in dict((config.get("solution") or {}).get("env") or {}).items()
        },
        "ignored": ignored,
    }


def images_for(provider: str) -> str:
    """What task images become in sandbox ``provider``: E2B templates on ``e2b``, built images on
    ``image`` (apt-only Dockerfiles stay root filesystems there: the fast path), else root filesystems."""
    return {"e2b": "template", "image": "build"}.get(provider, "rootfs")


def load_harbor_tasks(path: str | Path, limit: int | None = None, images: str = "rootfs") -> list[Task]:
    """Every task of a Harbor dataset directory (or the one task), numbered from 0 (``images``: see
    :func:`load_task`)."""
    dirs = task_dirs(path)
    if limit is not None:
        dirs = dirs[:limit]
    tasks = [load_task(d, i, images) for i, d in enumerate(dirs)]
    names = [t.id for t in tasks]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(
            f"Harbor dataset {path}: task names repeat: {', '.join(sorted(str(d) for d in dup))}"
        )
    return tasks


def harbor_info(task: Task) -> dict[str, Any] | None:
    """The Harbor data (``metadata["harbor"]``) of a task of kind ``harbor``, else None."""
    info = task.metadata.get(HARBOR) if task.kind == HARBOR else None
    return info if isinstance(info, dict) else None
