"""Version-aware masking: what to do with tokens and groups from older policies.

Staleness is measured against a reference version ``v_ref``, by ``staleness_reference``:

* ``trainer``: the version of the weights the trainer is about to update (``initial_version +
  step - 1``): right when the trainer's weights are what the rollout samples with (the loop,
  ``train --push-to``), as each step's update becomes the next policy version;
* ``data``: the newest policy version of the data the trainer has consumed so far (the *data
  frontier*: every group up to and including the one being masked, in consumption order): right
  for a recorded run trained offline, whose versions do not grow with the trainer's steps (all of
  the quickstart's tokens are version 0; against the trainer's version they would all be stale
  from step 3 on).

A generated token stamped with version ``v``:

* is masked (``loss_mask`` 0) when ``v < v_ref - max_staleness`` (``max_staleness`` None: off; default 1, as :class:`~dressage.training.config.TrainConfig`);
* with ``last_version_only``, is masked when ``v`` is not the newest version in its segment
  (a turn that spanned a weight update keeps only the part generated after it).

A whole group is dropped when any of its tokens has ``v < v_ref - group_version_window``.
Every decision is counted per sample (``TrainSample.masking``) and lands in the step manifest, and
each response token's reason (:data:`MASK_REASONS`, ``TrainSample.mask_reasons``) is stored with the
step (``train_token_decisions``, the ``token_decisions`` view; docs/training.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dressage.errors import ConfigError
from dressage.training.samples import TrainSample

FAILURE_POLICIES = ("drop_group", "keep_finished")
STALENESS_REFERENCES = ("trainer", "data")

MASK_REASONS: tuple[tuple[str, str], ...] = (
    ("trained", "not masked: the token is trained"),
    ("prompt", "before the sample's response (its first trained token): the prompt"),
    ("not_generated", "a context token inside the response (tool result, user message): not sampled"),
    ("recorded_untrained", "sampled by the policy but recorded with loss mask 0 (e.g. an abandoned turn)"),
    ("stale", "sampled by a policy more than max_staleness versions behind the trained weights"),
    ("not_last_version", "last_version_only: sampled before the newest policy version of its segment"),
    ("tree_shared", "reserved: a prefix a trajectory tree trains once, in another sample"),
)
"""Why a token of a trained sample has loss mask 0 (``trained``: it has not): the code of a reason is
its index. The one vocabulary: the ``mask_reasons`` table holds it (append only; a new reason gets
the next code and a migration inserting it; tests/training/test_token_decisions.py compares them)."""

MASK_CODES: dict[str, int] = {name: code for code, (name, _) in enumerate(MASK_REASONS)}
"""Reason name -> code."""


@dataclass(frozen=True)
class MaskingPolicy:
    """Options of version-aware masking and of groups with failed members."""

    max_staleness: int | None = 1
    last_version_only: bool = False
    group_version_window: int | None = None
    failure_policy: str = "drop_group"
    staleness_reference: str = "data"
    """``trainer`` or ``data`` (the module docstring). ``data`` unless the trainer's weights become
    the engines' next versions (the loop, ``--push-to``, slime); manifests recorded before this
    option existed were formed with ``trainer`` (:meth:`StepOptions.from_dict` restores it)."""

    def __post_init__(self) -> None:
        for name in ("max_staleness", "group_version_window"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be >= 0 or unset, got {value}")
        if self.failure_policy not in FAILURE_POLICIES:
            raise ConfigError(
                f"failure policy must be one of {FAILURE_POLICIES}, got {self.failure_policy!r}"
            )
        if self.staleness_reference not in STALENESS_REFERENCES:
            raise ConfigError(
                f"staleness reference must be one of {STALENESS_REFERENCES}, got {self.staleness_reference!r}"
            )

    def reference_version(
        self, samples: Sequence[TrainSample], trainer_version: int, frontier: int | None
    ) -> int:
        """The version a group's staleness is measured against: the trainer's, or (``data``) the
        data frontier once the group's own newest version is counted (``frontier``: the newest
        version of the groups consumed before it, None before the first)."""
        if self.staleness_reference == "trainer":
            return trainer_version
        newest = newest_version(samples)
        known = [v for v in (frontier, newest) if v is not None]
        return max(known) if known else trainer_version

    def as_dict(self) -> dict[str, object]:
        """For the manifest."""
        return asdict(self)


def apply_version_mask(sample: TrainSample, policy: MaskingPolicy, trainer_version: int) -> None:
    """Zero ``sample.loss_mask`` where the policy version is too old; count the decisions and set
    each response token's reason code (``sample.mask_reasons``, :data:`MASK_REASONS`) in place."""
    versions_R = sample.policy_versions
    generated_R = versions_R >= 0
    keep_R = sample.stored_loss_mask.astype(np.bool_).copy()
    reasons_R = np.full(keep_R.shape, MASK_CODES["trained"], dtype=np.uint8)
    reasons_R[~keep_R] = MASK_CODES["recorded_untrained"]
    reasons_R[~generated_R] = MASK_CODES["not_generated"]
    counts = {"recorded_trainable": int(keep_R.sum())}
    if policy.max_staleness is not None:
        stale_R = generated_R & (versions_R < trainer_version - policy.max_staleness)
        counts["masked_stale"] = int((keep_R & stale_R).sum())
        reasons_R[keep_R & stale_R] = MASK_CODES["stale"]
        keep_R &= ~stale_R
    if policy.last_version_only and generated_R.any():
        newest = int(versions_R[generated_R].max())
        older_R = generated_R & (versions_R != newest)
        counts["masked_not_last_version"] = int((keep_R & older_R).sum())
        reasons_R[keep_R & older_R] = MASK_CODES["not_last_version"]
        keep_R &= ~older_R
    counts["trainable"] = int(keep_R.sum())
    sample.loss_mask = keep_R.astype(np.int32)
    sample.mask_reasons = reasons_R
    sample.masking = counts


def newest_version(samples: Sequence[TrainSample]) -> int | None:
    """The newest policy version that generated a token of ``samples``; None when none did."""
    versions = [int(s.policy_versions.max()) for s in samples if s.policy_versions.size]
    newest = max(versions, default=-1)
    return newest if newest >= 0 else None


def reason_counts(samples: Sequence[TrainSample]) -> dict[str, int]:
    """How many response tokens of ``samples`` have each mask reason (after :func:`apply_version_mask`)."""
    total = np.zeros(len(MASK_REASONS), dtype=np.int64)
    for s in samples:
        if s.mask_reasons is not None:
            total += np.bincount(s.mask_reasons, minlength=len(MASK_REASONS))
    return {MASK_REASONS[code][0]: int(n) for code, n in enumerate(total) if n}


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
