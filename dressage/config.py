"""The one configuration object.

Settings are read here (environment variables with the ``DRESSAGE_`` prefix, overridable by
command-line options), built once at the entry point and passed down. The resolved settings go
into a run's frozen config snapshot, with secrets left out.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_HOME = Path(".dressage")
"""The embedded default lives under ``./.dressage/`` of the working directory."""


class Settings(BaseSettings):
    """Process-wide settings; every field can be set as ``DRESSAGE_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="DRESSAGE_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the event log; default: SQLite file under ./.dressage/.",
    )
    home: Path = Field(default=DEFAULT_HOME, description="Directory for the embedded database and artifacts.")
    artifacts_uri: str | None = Field(
        default=None, description="Where artifacts go (a local directory); default: <home>/artifacts."
    )
    admin_token: SecretStr | None = Field(default=None, description="Bearer token of the proxy's admin API.")
    view_token: SecretStr | None = Field(
        default=None, description="Token the web viewer asks for (required when it listens beyond loopback)."
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, description="Largest HTTP body the proxy accepts."
    )
    max_payload_bytes: int = Field(default=4 * 1024 * 1024, description="Largest JSON payload of one event.")
    secrets: list[SecretStr] = Field(
        default_factory=list, description="Extra secret values that must never reach logs or stored errors."
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


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, then apply non-None overrides (command-line options)."""
    settings = Settings()
    clean = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_copy(update=clean) if clean else settings
