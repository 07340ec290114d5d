"""Step metrics to Weights & Biases and TensorBoard (``--log-to wandb,tensorboard``).

The log stays the record (:mod:`dressage.training.metrics`); these loggers copy each committed
step's metrics (``train/<name>`` at the step) and the reward per policy version
(``reward/train`` and ``reward/eval`` at the version) into the ecosystem's two dashboards, through
their own libraries, imported only when asked for (optional extras ``dressage[wandb]`` and
``dressage[tensorboard]``; without them ``--log-to`` fails with a line saying what to install, and
nothing else changes).

* **TensorBoard**: event files under ``<out>/tensorboard`` (``torch.utils.tensorboard``'s writer,
  which needs the ``tensorboard`` package). TensorBoard stores scalars as 32-bit floats: the values
  read back are the log's rounded to float32.
* **W&B**: a run under ``<out>/wandb`` named after the dressage run, with the run config. Offline
  unless ``WANDB_MODE`` says otherwise or ``WANDB_API_KEY`` is set (``wandb sync`` uploads an
  offline run later). Rewards use ``policy_version`` as their x axis (``define_metric``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from dressage.config import Settings, load_settings
from dressage.errors import ConfigError
from dressage.store.event_store import EventStore
from dressage.store.records import Run

LOGGERS = ("wandb", "tensorboard")


def parse_log_to(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"wandb,tensorboard"`` (or a list) as a tuple of logger names; unknown names raise."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(x.strip() for x in items if x.strip()))
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"--log-to: unknown logger {name!r}; use {', '.join(LOGGERS)}")
    return names


class MetricLogger(Protocol):
    """One dashboard: scalars by step, rewards by policy version."""

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log one committed step's metrics."""

    def version(self, version: int, rewards: Mapping[str, float]) -> None:
        """Log the rewards of one policy version (``train``, ``eval``)."""

    def close(self) -> None:
        """Flush and close."""


class TensorBoardLogger:
    """Scalars in TensorBoard event files."""

    def __init__(self, log_dir: Path) -> None:
        try:
            import tensorboard  # noqa: F401  (the writer below needs it; say so if it is missing)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(
                f"--log-to tensorboard needs the tensorboard package and torch ({e.name} is missing): "
                "pip install 'dressage[tensorboard]'"
            ) from None
        self.dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """``train/<name>`` at ``step``."""
        for name, value in metrics.items():
            self.writer.add_scalar(f"train/{name}", value, global_step=step)
        self.writer.flush()

    def version(self, version: int, rewards: Mapping[str, float]) -> None:
        """``reward/<kind>`` at ``version``."""
        for kind, value in rewards.items():
            self.writer.add_scalar(f"reward/{kind}", value, global_step=version)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


WandbMode = Literal["online", "offline", "disabled", "shared"]


def wandb_mode(settings: Settings) -> WandbMode:
    """``WANDB_MODE`` when set, else ``online`` with an API key and ``offline`` without one."""
    return settings.wandb_mode or ("online" if settings.wandb_api_key else "offline")


class WandbLogger:
    """A Weights & Biases run (offline without an API key)."""

    def __init__(self, out_dir: Path, run_name: str, config: Mapping[str, object]) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "--log-to wandb needs the wandb package: pip install 'dressage[wandb]'"
            ) from None
        out_dir.mkdir(parents=True, exist_ok=True)
        settings = load_settings()
        self.run = wandb.init(
            project=settings.wandb_project,
            name=run_name,
            dir=str(out_dir),
            mode=wandb_mode(settings),
            config=dict(config),
            reinit="create_new",
        )
        # Each series has its own x axis, logged as a value: W&B's own step stays implicit, so no row
        # waits for a later step to be committed and none is dropped for arriving "out of order".
        self.run.define_metric("train/step")
        self.run.define_metric("train/*", step_metric="train/step")
        self.run.define_metric("policy_version")
        self.run.define_metric("reward/*", step_metric="policy_version")
        self.dir = Path(self.run.dir).parent

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """``train/<name>`` against ``train/step`` (the trainer's step), one committed row per step."""
        self.run.log({"train/step": step, **{f"train/{k}": v for k, v in metrics.items()}})

    def version(self, version: int, rewards: Mapping[str, float]) -> None:
        """``reward/<kind>`` against ``policy_version``."""
        self.run.log({"policy_version": version, **{f"reward/{k}": v for k, v in rewards.items()}})

    def close(self) -> None:
        """Finish the run (offline: everything is in its ``.wandb`` file)."""
        self.run.finish()


class Loggers:
    """The chosen loggers together; each call goes to all of them."""

    def __init__(self, loggers: Iterable[MetricLogger] = ()) -> None:
        self.loggers = list(loggers)

    @classmethod
    def open(
        cls, names: Sequence[str], out_dir: Path, run_name: str, config: Mapping[str, object]
    ) -> Loggers:
        """Open ``names`` writing under ``out_dir`` (``tensorboard/``, ``wandb/``)."""
        opened: list[MetricLogger] = []
        try:
            for name in names:
                if name == "tensorboard":
                    opened.append(TensorBoardLogger(out_dir / "tensorboard"))
                elif name == "wandb":
                    opened.append(WandbLogger(out_dir, run_name, config))
        except BaseException:
            for logger in opened:
                logger.close()
            raise
        return cls(opened)

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log one step's metrics everywhere."""
        for logger in self.loggers:
            logger.step(step, metrics)

    def versions(self, rewards: Mapping[int, Mapping[str, float]]) -> None:
        """Log the rewards of each policy version, in version order."""
        for version in sorted(rewards):
            for logger in self.loggers:
                logger.version(version, rewards[version])

    def close(self) -> None:
        """Close every logger."""
        for logger in self.loggers:
            logger.close()


def version_rewards(store: EventStore, run: str | Run) -> dict[int, dict[str, float]]:
    """Training and eval mean reward per policy version (``{version: {"train": r, "eval": r}}``)."""
    out: dict[int, dict[str, float]] = {}
    for kind in ("train", "eval"):
        for version, mean, _ in store.sessions.rewards_by_version(run, kind):
            out.setdefault(version, {})[kind] = mean
    return out
