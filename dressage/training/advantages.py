"""Advantage estimators (a registry) and their broadcast from anchors to every segment.

An estimator maps the rewards of one group's anchors, ``rewards_G``, to advantages ``adv_G``.
The advantage of a trajectory is computed on its anchor segment and **broadcast** to every
segment of that trajectory (same ``rollout_id``), so a subagent's or pre-compaction segment is
credited with the outcome of the whole episode.

Built-in:

* ``grpo``: ``A_i = R_i - mean(R)``; with ``std_normalize``: ``A_i = (R_i - mean(R)) / (std(R) + eps)``
  (population std, ``ddof=0``).
* ``reinforce``: ``A_i = R_i`` (no baseline).
* ``tree``: for a group with forked sessions, per-node advantages ``V(node) - V(parent)``
  (:mod:`dressage.training.trees`, docs/trees.md); on a group without forks it is ``grpo``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from dressage.errors import ConfigError, TrainingError
from dressage.training.samples import TrainSample


class AdvantageEstimator(Protocol):
    """``rewards_G`` (float64) → ``adv_G`` (float64), one group at a time."""

    def __call__(self, rewards_G: np.ndarray, *, std_normalize: bool, eps: float) -> np.ndarray: ...


_REGISTRY: dict[str, AdvantageEstimator] = {}


def register_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an estimator available as ``--advantage-estimator NAME``."""

    def deco(fn: AdvantageEstimator) -> AdvantageEstimator:
        _REGISTRY[name] = fn
        return fn

    return deco


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; :class:`ConfigError` names the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown advantage estimator {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def estimator_names() -> list[str]:
    """Names of the registered estimators."""
    return sorted(_REGISTRY)


@register_estimator("grpo")
def grpo(rewards_G: np.ndarray, *, std_normalize: bool = False, eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``A = R - mean(R)``, optionally divided by ``std(R) + eps`` (``ddof=0``).

    A one-member group has advantage 0 (nothing to compare with).
    """
    rewards_G = np.asarray(rewards_G, dtype=np.float64)
    adv_G = rewards_G - rewards_G.mean()
    if std_normalize:
        adv_G = adv_G / (rewards_G.std() + eps)
    return adv_G


@register_estimator("tree")
def tree(rewards_G: np.ndarray, *, std_normalize: bool = False, eps: float = 1e-6) -> np.ndarray:
    """The tree estimator on a group without forks: every session is a root node under the group's
    virtual root, so ``A = V(node) - V(root) = R - mean(R)`` (GRPO). Groups with forks take the
    per-node path of :mod:`dressage.training.trees`."""
    return grpo(rewards_G, std_normalize=std_normalize, eps=eps)


@register_estimator("reinforce")
def reinforce(rewards_G: np.ndarray, *, std_normalize: bool = False, eps: float = 1e-6) -> np.ndarray:
    """Plain REINFORCE: ``A = R`` (optionally ``/ (std(R) + eps)``)."""
    rewards_G = np.asarray(rewards_G, dtype=np.float64)
    return rewards_G / (rewards_G.std() + eps) if std_normalize else rewards_G.copy()


def assign_advantages(
    group: Sequence[TrainSample],
    estimator: str | AdvantageEstimator = "grpo",
    *,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> dict[int, float]:
    """Compute the group's advantages on its anchors and broadcast them to every segment in place.

    ``group`` holds every sample (all segments) of one group's kept trajectories. Returns
    ``{rollout_id: advantage}``.
    """
    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    anchors = [s for s in group if s.is_anchor]
    rollout_ids = [s.rollout_id for s in anchors]
    if len(set(rollout_ids)) != len(rollout_ids):
        raise TrainingError(f"a trajectory has more than one anchor segment: rollout ids {rollout_ids}")
    missing = {s.rollout_id for s in group} - set(rollout_ids)
    if missing:
        raise TrainingError(f"trajectories {sorted(missing)} have no anchor segment")
    if not anchors:
        return {}
    rewards_G = np.asarray([s.reward for s in anchors], dtype=np.float64)
    adv_G = fn(rewards_G, std_normalize=std_normalize, eps=eps)
    by_rollout = {rid: float(a) for rid, a in zip(rollout_ids, adv_G, strict=True)}
    for s in group:
        s.advantage = by_rollout[s.rollout_id]
    return by_rollout
