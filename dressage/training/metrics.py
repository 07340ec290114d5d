"""Step metrics: what a step's batch holds (from the log) and how training on it went (the backend).

Every committed step records its metrics in ``train_step_metrics`` in the same transaction as its
manifest (:meth:`~dressage.store.consumers.ConsumerRepository.commit_step`), one row per (step,
metric name); the ``step_metrics`` view shows one row per step. Two kinds:

* **batch metrics** (:func:`batch_metrics`), a pure function of the formed batch, so replay
  recomputes them and compares them bitwise: ``trained_tokens``, ``samples``, ``trajectories``,
  ``response_length_mean``/``_max``, ``reward_mean``/``_std`` (over the batch's trajectories),
  ``staleness_mean``/``_max`` (trainer version minus the policy version of each trained token) and
  the staleness distribution ``staleness_tokens_<k>`` (trained tokens ``k`` versions behind);
* **trainer metrics**, from the backend's :meth:`train_step` (the torch backend: ``loss``,
  ``pg_loss``, ``entropy``, ``kl_behaviour``, ``grad_norm``, ``lr``, ``clip_fraction``,
  ``is_ratio_mean``/``_max``, ``is_truncated_share``; see :mod:`dressage.training.torch_backend`),
  plus ``step_time_s`` and ``tokens_per_s`` measured by the trainer around the backend's work.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

from dressage.errors import InvalidRecordError
from dressage.store.views import BATCH_STEP_METRICS, TIMING_STEP_METRICS, TORCH_STEP_METRICS
from dressage.training.steps import StepBatch

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
BATCH_METRICS = BATCH_STEP_METRICS
"""The batch metrics every step records (the ``step_metrics`` view's columns, defined with it)."""

TORCH_METRICS = TORCH_STEP_METRICS
"""What the torch backend measures in each step."""

TIMING_METRICS = TIMING_STEP_METRICS


def batch_metrics(batch: StepBatch) -> dict[str, float]:
    """The batch metrics of ``batch`` (see the module docstring); deterministic, so replayable."""
    samples = batch.samples
    trained = [np.asarray(s.loss_mask, dtype=bool) for s in samples]
    lengths = np.asarray([s.response_length for s in samples], dtype=np.float64)
    rewards = np.asarray(
        [r for _, r in sorted({s.rollout_id: float(s.reward) for s in samples}.items())], dtype=np.float64
    )
    stale = np.concatenate(
        [
            batch.trainer_version - np.asarray(s.policy_versions, dtype=np.int64)[m]
            for s, m in zip(samples, trained, strict=True)
        ]
        or [np.zeros(0, dtype=np.int64)]
    )
    out = {
        "trained_tokens": float(sum(int(m.sum()) for m in trained)),
        "samples": float(len(samples)),
        "trajectories": float(len(rewards)),
        "response_length_mean": float(lengths.mean()) if lengths.size else 0.0,
        "response_length_max": float(lengths.max()) if lengths.size else 0.0,
        "reward_mean": float(rewards.mean()) if rewards.size else 0.0,
        "reward_std": float(rewards.std()) if rewards.size else 0.0,
        "staleness_mean": float(stale.mean()) if stale.size else 0.0,
        "staleness_max": float(stale.max()) if stale.size else 0.0,
    }
    for k, n in zip(*np.unique(stale, return_counts=True), strict=True):
        out[f"staleness_tokens_{int(k)}"] = float(n)
    return out


def checked(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` as plain floats; a bad name or a non-number raises naming the metric.

    Non-finite values (a diverged loss) are kept: the log should show them.
    """
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not NAME.match(name):
            raise InvalidRecordError(f"metric name {name!r} must match {NAME.pattern}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRecordError(f"metric {name!r} must be a number, got {type(value).__name__}")
        out[name] = float(value)
    return out


def same(a: float, b: float) -> bool:
    """Bitwise-equal floats (NaN equals NaN)."""
    return a == b or (math.isnan(a) and math.isnan(b))
