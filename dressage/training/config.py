"""The trainer's config (:class:`TrainConfig`) and the one place a trainer is built (:func:`build_trainer`).

``dressage-worker train`` and ``dressage-worker loop`` both build their trainer here, from the same
:class:`TrainConfig` with the same defaults: the ``train:`` section of ``run.yaml`` for the loop, the
command's options for ``train`` (whose defaults are this model's, see docs/architecture.md, "The
command line's conventions"). What a config does not say is per command: the run, the consumer,
where checkpoints go, the model to start from (:class:`TrainerSetup`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dressage.errors import ConfigError
from dressage.training.masking import MaskingPolicy

if TYPE_CHECKING:  # imported where a trainer is built: the CLI reads TrainConfig's defaults without the store
    from dressage.store import EventStore, Run
    from dressage.training.consumer import Backend, Trainer
    from dressage.training.health import CollapseWatch
    from dressage.training.steps import StepOptions
    from dressage.training.weight_push import WeightPusher

BACKENDS = ("torch", "slime-dump", "none")
"""Backends of ``train --backend`` (``slime-dump`` is built by :mod:`dressage.integrations.slime`)."""


class TrainConfig(BaseModel):
    """How to train: the ``train:`` section of ``run.yaml`` (``dressage-worker loop``) and the
    defaults of ``dressage-worker train``'s options.

    In the loop the model is the engine's (``engine.model`` with ``engine.seed``), so step 1 starts
    from exactly the weights that sampled iteration 0; there ``global_batch_size`` defaults to a whole
    iteration (every task x ``n_samples_per_prompt``): one optimizer step and one weight push per iteration.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(default=1e-4, gt=0, description="Learning rate.")
    optimizer: Literal["sgd", "adam"] = "sgd"
    trainable: Literal["all", "lm_head"] = Field(
        default="all", description="lm_head: train only the output projection (random-weight demos)."
    )
    global_batch_size: int | None = Field(
        default=None, ge=1, description="Trajectories per optimizer step; default: one iteration's."
    )
    advantage_estimator: str = Field(default="grpo", description="Registered advantage estimator.")
    std_normalize: bool = Field(default=False, description="Divide GRPO advantages by the group's std.")
    eps_clip: float = Field(default=0.2, gt=0, description="PPO clip range.")
    tis_cap: float = Field(default=2.0, gt=0, description="Cap of the truncated importance weight.")
    max_staleness: int | None = Field(
        default=1, ge=0, description="Mask tokens this many versions older than the trainer (async)."
    )
    last_version_only: bool = Field(
        default=False, description="Train only tokens of a segment's newest version."
    )
    group_version_window: int | None = Field(
        default=None, ge=0, description="Drop groups with tokens older than this many versions."
    )
    failure_policy: Literal["drop_group", "keep_finished"] = Field(
        default="drop_group",
        description="A group with a failed member: dropped whole, or trained on its finished members.",
    )
    staleness_reference: Literal["auto", "trainer", "data"] = Field(
        default="auto",
        description="Staleness against the trainer's version or the data's newest; auto: trainer when "
        "its weights are pushed to the engines (loop, --push-to), else data (offline).",
    )
    empty_steps: Literal["stop", "skip"] = Field(
        default="stop",
        description="A step that would train 0 tokens: stop (commit nothing, say why) or skip its groups.",
    )
    warn_entropy_below: float | None = Field(
        default=0.1, ge=0, description="Warn when the mean entropy (nats) stays below this (torch)."
    )
    warn_grad_norm_at_most: float | None = Field(
        default=0.0, ge=0, description="Warn when grad_norm stays at most this (torch)."
    )
    warn_after_steps: int = Field(
        default=2, ge=1, description="Consecutive steps before the entropy or grad_norm warning."
    )
    reference: Literal["initial"] | None = Field(
        default=None,
        description="torch: keep a frozen copy of the initial weights and record kl_reference each step.",
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="torch: add kl_coef * KL(trainer || reference) to the loss (needs reference).",
    )
    keep_checkpoints: int = Field(default=2, ge=1, description="Newest step checkpoints kept on disk.")
    log_to: list[Literal["wandb", "tensorboard"]] = Field(
        default_factory=list,
        description="Also log step metrics and rewards to these (docs/training.md); --log-to overrides.",
    )

    @model_validator(mode="after")
    def _kl_needs_a_reference(self) -> TrainConfig:
        if self.kl_coef > 0 and self.reference is None:
            raise ValueError("kl_coef > 0 needs a reference model: set reference: initial")
        return self

    def masking(self, *, pushes: bool = False) -> MaskingPolicy:
        """The version-aware masking and failure policy of the steps; ``pushes``: the trainer's
        weights become the engines' next policy versions (resolves ``staleness_reference: auto``)."""
        reference = self.staleness_reference
        if reference == "auto":
            reference = "trainer" if pushes else "data"
        return MaskingPolicy(
            self.max_staleness,
            self.last_version_only,
            self.group_version_window,
            self.failure_policy,
            reference,
        )

    def collapse_watch(self) -> CollapseWatch:
        """The entropy and grad_norm warnings of these thresholds (:mod:`dressage.training.health`)."""
        from dressage.training.health import CollapseWatch

        return CollapseWatch(self.warn_entropy_below, self.warn_grad_norm_at_most, self.warn_after_steps)


@dataclass(frozen=True)
class TrainerSetup:
    """What a trainer needs beyond its :class:`TrainConfig`: the run and consumer, the start."""

    run: str | Run
    consumer: str
    out: Path
    """Checkpoints (torch) or rollout files (slime-dump)."""
    n_samples_per_prompt: int
    backend: str = "torch"
    model: str = "tiny"
    seed: int = 0
    initial_version: int = 0


def step_options(cfg: TrainConfig, setup: TrainerSetup, *, pushes: bool = False) -> StepOptions:
    """The step options ``cfg`` and ``setup`` make (``cfg.global_batch_size`` must be resolved);
    ``pushes``: see :meth:`TrainConfig.masking`."""
    from dressage.training.steps import StepOptions

    if cfg.global_batch_size is None:
        raise ConfigError("train.global_batch_size is unset: give the trajectories per optimizer step")
    return StepOptions(
        cfg.global_batch_size,
        setup.n_samples_per_prompt,
        cfg.advantage_estimator,
        cfg.std_normalize,
        initial_version=setup.initial_version,
        masking=cfg.masking(pushes=pushes),
        empty_steps=cfg.empty_steps,
    )


def build_backend(cfg: TrainConfig, setup: TrainerSetup, push: WeightPusher | None = None) -> Backend:
    """The ``torch`` or ``none`` backend of ``setup.backend`` (``slime-dump`` is the caller's)."""
    from dressage.training.consumer import NullBackend

    if setup.backend == "none":
        return NullBackend()
    if setup.backend == "torch":
        from dressage.training.torch_backend import TorchBackend

        optimization = cfg.model_dump(
            include={"lr", "optimizer", "trainable", "eps_clip", "tis_cap", "reference", "kl_coef"}
        )
        return TorchBackend(setup.out, model=setup.model, seed=setup.seed, push=push, **optimization)
    raise ConfigError(f"unknown backend {setup.backend!r}; use {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}")


def build_trainer(
    cfg: TrainConfig,
    store: EventStore,
    setup: TrainerSetup,
    backend: Backend | None = None,
    *,
    push: WeightPusher | None = None,
    reader: EventStore | None = None,
) -> Trainer:
    """The trainer of ``train`` and ``loop``: steps from ``cfg``, the backend ``setup`` names (or
    ``backend``, built by the caller), groups and turns read from ``reader`` (a streaming replica).
    With ``push`` the trainer's weights become the engines' policy versions, so staleness is
    measured against the trainer's version (``staleness_reference: auto``)."""
    from dressage.training.consumer import Trainer

    options = step_options(cfg, setup, pushes=push is not None)
    chosen = backend if backend is not None else build_backend(cfg, setup, push)
    return Trainer(
        store, setup.run, options, chosen, consumer=setup.consumer, reader=reader, watch=cfg.collapse_watch()
    )
