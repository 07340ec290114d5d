"""Secrets of a run: declared by name in ``run.yaml``, valued from the worker's environment.

``sandbox.env`` and ``agent.env`` are stored with the run's frozen config, so a credential written
there would be at rest in the log. Instead a run lists the *names* of the variables it needs::

    secrets:
      sandbox: [GITHUB_TOKEN]   # set in every command of the sandbox
      agent: [UPSTREAM_API_KEY] # set only in the blackbox agent's command

Each worker reads the values from its own environment when it starts (a missing one is a config
error naming it). The snapshot holds the names (in the config) and a short sha256 digest per value
(``secret_digests``, to tell which credential a run used); the values reach the sandbox and the
agent at run time only, through bubblewrap's argument file descriptor (never a command line), and
are added to the redaction list, so an agent that prints one gets ``[REDACTED]`` in its
``agent.log``, the session's error and the worker's console. A value in ``sandbox.env`` or
``agent.env`` that looks like a credential is refused with a message pointing here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dressage.config import environment_values
from dressage.errors import ConfigError
from dressage.redact import is_secret_value, redact

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DIGEST_HEX_CHARS = 16


class SecretsConfig(BaseModel):
    """The ``secrets:`` section: environment variable names, per destination."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: list[str] = Field(default_factory=list, description="Set in every sandbox command.")
    agent: list[str] = Field(default_factory=list, description="Set in the blackbox agent's command only.")

    @field_validator("sandbox", "agent")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return names


@dataclass(frozen=True)
class RunSecrets:
    """The resolved values (kept in memory only)."""

    sandbox: dict[str, str] = field(default_factory=dict)
    agent: dict[str, str] = field(default_factory=dict)

    def values(self) -> tuple[str, ...]:
        """Every value, for the redaction list."""
        return tuple(dict.fromkeys([*self.sandbox.values(), *self.agent.values()]))

    def digests(self) -> dict[str, str]:
        """``{"sandbox.NAME": "sha256:<16 hex>"}`` for the run's snapshot."""
        out = {}
        for where, values in (("sandbox", self.sandbox), ("agent", self.agent)):
            for name, value in sorted(values.items()):
                digest = hashlib.sha256(value.encode()).hexdigest()[:DIGEST_HEX_CHARS]
                out[f"{where}.{name}"] = f"sha256:{digest}"
        return out


def resolve_secrets(cfg: SecretsConfig) -> RunSecrets:
    """Read the declared secrets from the worker's environment; a missing one is a :class:`ConfigError`."""
    resolved: dict[str, dict[str, str]] = {}
    for where, names in (("sandbox", cfg.sandbox), ("agent", cfg.agent)):
        values = environment_values(names)
        missing = [n for n, v in values.items() if not v]
        if missing:
            raise ConfigError(
                f"secrets.{where}: {', '.join(missing)} is not set in the worker's environment "
                "(declared secrets take their values from there)"
            )
        resolved[where] = {n: v for n, v in values.items() if v}
    return RunSecrets(sandbox=resolved["sandbox"], agent=resolved["agent"])


def check_no_cleartext_secrets(env: Mapping[str, str], where: str) -> None:
    """Refuse an ``env`` value that looks like a credential (it would be stored with the run): a
    known key format, or any value of a variable named like one (``HF_TOKEN``, ``DB_PASSWORD``)."""
    for name, value in env.items():
        if redact(value) != value or is_secret_value(name, value):
            raise ConfigError(
                f"{where}.{name}: the value looks like a secret and {where} is stored with the run; "
                f"declare the name under secrets.{where.split('.')[0]} and set it in the worker's environment"
            )


def check_config_has_no_secrets(config: object, where: str = "") -> None:
    """Refuse a run's frozen config holding a credential anywhere (an agent or reward command, an
    engine URL with a password, a ``token:`` field...): the config is stored with the run. Names the
    first field found; the fix is the same as for ``sandbox.env``."""
    if isinstance(config, Mapping):
        for key, value in config.items():
            at = f"{where}.{key}" if where else str(key)
            if isinstance(value, str) and is_secret_value(str(key), value):
                raise ConfigError(_CONFIG_SECRET.format(at=at))
            check_config_has_no_secrets(value, at)
    elif isinstance(config, list | tuple):
        for i, value in enumerate(config):
            check_config_has_no_secrets(value, f"{where}[{i}]")
    elif isinstance(config, str) and redact(config) != config:
        raise ConfigError(_CONFIG_SECRET.format(at=where))


_CONFIG_SECRET = (
    "{at}: the value holds what looks like a secret, and the run's config is stored with the run; "
    "set it in the worker's environment and declare its name under secrets.sandbox or secrets.agent "
    "(commands read it as $NAME)"
)
