"""``harbor run --env dressage.harbor.environment:Environment``: Harbor trials in our bubblewrap sandbox.

A Harbor ``BaseEnvironment`` over :class:`~dressage.paddock.bwrap.BwrapSandbox` (Python 3.12 with the
``harbor`` extra; see docs/harbor.md). It honours the task the way the rollout worker does: Harbor's
paths (the workdir, ``/tests``, ``/logs``, ``/solution``) are workspace directories bound in place
(:mod:`dressage.harbor.sandbox`), an image-less task runs over the host's ``/usr``, a whitelisted
Dockerfile runs in its cached Debian root filesystem, any other Dockerfile (or a ``docker_image``,
or a one-service compose file) in its image built by :mod:`dressage.harbor.build` on the ``image``
provider (built when the trial starts, once per Dockerfile content); an unknown base image or what
a compose file asks beyond one service is refused with the task and line or field. The sandbox has no network unless the environment
option ``network=true`` is given (``--ek network=true``); a task that wants internet gets it only then.

Each ``exec`` is a fresh bubblewrap process over the same files (see :mod:`dressage.paddock.bwrap`):
files persist between commands, background processes do not. ``user`` is accepted and ignored (every
command runs as the sandbox user, uid 1000, which owns the workspace; in a task image, as the
image's ``USER``).
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult  # type: ignore[import-not-found,unused-ignore]
from harbor.environments.capabilities import (  # type: ignore[import-not-found,unused-ignore]
    EnvironmentCapabilities,
)

from dressage.errors import ConfigError
from dressage.harbor import build
from dressage.harbor.compose import compose_environment
from dressage.harbor.dockerfile import RootfsPlan, parse_dockerfile, rootfs_plan
from dressage.harbor.rootfs import cached_rootfs
from dressage.harbor.sandbox import harbor_mounts
from dressage.harbor.tasks import DEFAULT_WORKDIR
from dressage.paddock.base import SandboxSpec, resolve_in_workspace
from dressage.paddock.bwrap import BwrapProvider, BwrapSandbox
from dressage.paddock.image import ImageProvider


class Environment(BaseEnvironment):  # type: ignore[misc,unused-ignore]
    """Harbor's environment interface over a dressage bubblewrap sandbox (see the module docstring)."""

    def __init__(self, *args: object, network: bool | str = False, **kwargs: object) -> None:
        self._network = str(network).lower() in ("1", "true", "yes")
        self._plan: RootfsPlan | None = None
        self._build: str | None = None
        """A Dockerfile that is not apt-only (its file name): built as written by :mod:`dressage.harbor.build`."""
        self._image: str | None = None
        self._refusal: ConfigError | None = None
        self.sandbox: BwrapSandbox | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        """Harbor's name of this environment type."""
        return "dressage-bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """No GPUs, no compose, no Windows; it can run without internet (its default)."""
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Read a whitelisted Dockerfile's plan. What our sandbox cannot honour is kept as the refusal
        :meth:`start` raises: Harbor builds every trial's environment before the job runs (an error
        here would stop the whole job), while a failed start is that trial's exception."""
        try:
            self._check_definition()
        except ConfigError as e:
            self._refusal = e

    def _check_definition(self) -> None:
        env_dir = Path(self.environment_dir)
        name = self.environment_name
        compose = compose_environment(name, env_dir, "build")
        self._compose_env: dict[str, str] = dict(compose.get("env") or {})
        self._compose_workdir: str | None = compose.get("workdir")
        dockerfile = env_dir / str(compose.get("dockerfile") or "Dockerfile")
        docker_image = compose.get("docker_image") or self.task_env_config.docker_image
        if dockerfile.is_file():
            text = dockerfile.read_text(encoding="utf-8")
            try:
                self._plan = parse_dockerfile(name, text)
            except ConfigError:
                build.bases(name, text)  # an unknown base is refused now, naming the line and the image
                self._build = dockerfile.name
        elif docker_image:
            self._image = build.prebuilt(name, str(docker_image))

    @property
    def workdir(self) -> str:
        """The task's working directory: ``[environment] workdir``, the Dockerfile's, or ``/app``."""
        own = self._plan.workdir if self._plan else self._image_workdir
        return str(self.task_env_config.workdir or self._compose_workdir or own or DEFAULT_WORKDIR)

    _image_workdir: str | None = None
    _compose_env: dict[str, str] = {}
    _compose_workdir: str | None = None

    async def _built_image(self) -> str | None:
        """The task image's reference (built once per Dockerfile content, in a thread), or None when
        the task runs on a root filesystem or the host's ``/usr``; a failed build raises its error."""
        if self._build is not None:
            env_dir = Path(self.environment_dir)
            text = (env_dir / self._build).read_text(encoding="utf-8")
            built = await asyncio.to_thread(build.build, self.environment_name, text, env_dir, self._build)
            if built.ref is None:
                raise ConfigError(built.error or f"task {self.environment_name}: its image was not built")
            self._image = built.ref
        if self._image is not None:
            self._image_workdir = await asyncio.to_thread(build.image_workdir, self._image)
        return self._image

    async def start(self, force_build: bool) -> None:
        """Create the sandbox (with its root filesystem, which must already be built); a refused task
        definition fails here, naming the task and line."""
        if self._refusal is not None:
            raise self._refusal
        image = await self._built_image()
        rootfs = None
        env: dict[str, str] = dict(self._compose_env)
        if self._plan is not None:
            rootfs = str(cached_rootfs(rootfs_plan(self._plan, Path(self.environment_dir))))
            env.update(self._plan.env)
        env.update({str(k): str(v) for k, v in (self.task_env_config.env or {}).items()})
        env.update(getattr(self, "_persistent_env", {}) or {})
        cfg = self.task_env_config
        mode = str(getattr(cfg.network_mode, "value", cfg.network_mode))
        wants = bool(cfg.allow_internet) if cfg.allow_internet is not None else mode == "public"
        spec = SandboxSpec(
            provider="image" if image else "bwrap",
            network=self._network and wants,
            timeout_s=600.0,
            max_timeout_s=24 * 3600.0,
            memory_mb=self.task_env_config.memory_mb or 2048,
            disk_mb=self.task_env_config.storage_mb or 1024,
            env=env,
            mounts=harbor_mounts(self.workdir),
            rootfs=rootfs,
            image=image,
        )
        provider = ImageProvider() if image else BwrapProvider()
        self.sandbox = await provider.create(self.session_id, spec)
        r = await self.sandbox.exec("mkdir -p /logs/agent /logs/verifier /logs/artifacts", timeout=60)
        if not r.ok:
            raise ConfigError(f"task {self.environment_name}: the sandbox does not start: {r.stderr[-300:]}")
        if self._plan is not None:  # COPYs into the workdir seed the workspace
            for src, dst in self._plan.copies:
                if dst.startswith(self.workdir.rstrip("/") + "/") or dst == self.workdir:
                    source = Path(self.environment_dir) / src
                    target = dst if not dst.endswith("/") else dst + source.name
                    if source.is_dir():
                        await self.upload_dir(source, dst)
                    else:
                        await self.upload_file(source, target)
        elif image is None:  # image-less: environment/ is the workdir's initial content, as in a rollout
            env_dir = Path(self.environment_dir)
            for source in sorted(p for p in env_dir.rglob("*") if p.is_file() and p.name != ".gitkeep"):
                rel = source.relative_to(env_dir).as_posix()
                await self.upload_file(source, f"{self.workdir.rstrip('/')}/{rel}")

    async def stop(self, delete: bool) -> None:
        """Kill everything in the sandbox and remove its files."""
        if self.sandbox is not None:
            await self.sandbox.terminate()

    def _sb(self) -> BwrapSandbox:
        if self.sandbox is None:
            raise RuntimeError(f"environment {self.session_id} is not started")
        return self.sandbox

    def _rel(self, inside: str) -> str:
        """A path inside the sandbox as a workspace path (through the longest matching mount)."""
        p = str(inside).rstrip("/") or "/"
        mounts = {"/workspace": ".", **self._sb().spec.mounts}
        best = max((m for m in mounts if p == m or p.startswith(m.rstrip("/") + "/")), key=len, default=None)
        if best is None:
            raise ConfigError(
                f"{inside!r} is outside the sandbox's writable paths ({', '.join(sorted(mounts))})"
            )
        rest = p[len(best) :].lstrip("/")
        base = mounts[best]
        return f"{base}/{rest}" if rest and base != "." else (rest or base)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` from ``cwd`` (default: the workdir)."""
        sb = self._sb()
        full = f"cd {shlex.quote(cwd or self.workdir)} && {{ {command}\n}}"
        r = await sb.exec(
            ["/bin/bash", "-c", full] if Path("/bin/bash").exists() else full,
            env={**(env or {})},
            timeout=float(timeout_sec) if timeout_sec else sb.spec.max_timeout_s,
        )
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=r.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox."""
        await self._sb().write_file(self._rel(target_path), Path(source_path).read_bytes())

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory's files into the sandbox."""
        base = Path(source_dir)
        for f in sorted(base.rglob("*")):
            if f.is_file():
                await self.upload_file(f, f"{target_dir.rstrip('/')}/{f.relative_to(base).as_posix()}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a sandbox file to the host."""
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(await self._sb().read_file(self._rel(source_path)))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox directory to the host (symlinks copied as links, never followed)."""
        sb = self._sb()
        source = resolve_in_workspace(sb.root, self._rel(source_dir))
        if source.is_dir():
            shutil.copytree(source, Path(target_dir), symlinks=True, dirs_exist_ok=True)
