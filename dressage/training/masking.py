"""Version-aware masking: what to do with tokens and groups from older policies.

With ``v_train`` the version of the weights the trainer is about to update (``initial_version +
step - 1``), a generated token stamped with version ``v``:

* is masked (``loss_mask`` 0) when ``v < v_train - max_staleness`` (``max_staleness`` None: off; default 1, as :class:`~dressage.training.config.TrainConfig`);
* with ``last_version_only``, is masked when ``v`` is not the newest version in its segment
  (a turn that spanned a weight update keeps only the part generated after it).

A whole group is dropped when any of its tokens has ``v < v_train - group_version_window``.
Every decision is counted per sample (``TrainSample.masking``) and lands in the step manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dressage.errors import ConfigError
from dressage.training.samples import TrainSample

FAILURE_POLICIES = ("drop_group", "keep_finished")


@dataclass(frozen=True)
class MaskingPolicy:
    """Options of version-aware masking and of groups with failed members."""

    max_staleness: int | None = 1
    last_version_only: bool = False
    group_version_window: int | None = None
    failure_policy: str = "drop_group"

    def __post_init__(self) -> None:
        for name in ("max_staleness", "group_version_window"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 or unset, got {value}")
        if self.failure_policy not in FAILURE_POLICIES:
            raise ConfigError(
                f"failure policy must be one of {FAILURE_POLICIES}, got {self.failure_policy!r}"
            )

    def as_dict(self) -> dict[str, object]:
        """For the manifest."""
        return asdict(self)


def apply_version_mask(sample: TrainSample, policy: MaskingPolicy, trainer_version: int) -> None:
    """Zero ``sample.loss_mask`` where the policy version is too old; count the decisions in place."""
    versions_R = sample.policy_versions
    generated_R = versions_R >= 0
    keep_R = sample.stored_loss_mask.astype(np.bool_).copy()
    counts = {"recorded_trainable": int(keep_R.sum())}
    if policy.max_staleness is not None:
        stale_R = generated_R & (versions_R < trainer_version - policy.max_staleness)
        counts["masked_stale"] = int((keep_R & stale_R).sum())
        keep_R &= ~stale_R
    if policy.last_version_only and generated_R.any():
        newest = int(versions_R[generated_R].max())
        older_R = generated_R & (versions_R != newest)
        counts["masked_not_last_version"] = int((keep_R & older_R).sum())
        keep_R &= ~older_R
    counts["trainable"] = int(keep_R.sum())
    sample.loss_mask = keep_R.astype(np.int32)
    sample.masking = counts


def group_outside_window(
    samples: Sequence[TrainSample], policy: MaskingPolicy, trainer_version: int
) -> int | None:
    """The group's oldest generated version if it lies outside the window (drop it), else None."""
    if policy.group_version_window is None:
        return None
    versions = [
        int(s.policy_versions[s.policy_versions >= 0].min())
        for s in samples
        if (s.policy_versions >= 0).any()
    ]
    if not versions:
        return None
    oldest = min(versions)
    return oldest if oldest < trainer_version - policy.group_version_window else None
