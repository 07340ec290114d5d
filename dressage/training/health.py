"""What a trainer says when training goes nowhere: steps that would train no token, a collapsed policy.

* A step whose every response token is masked trains nothing: :func:`empty_step_reason` says why
  (the mask reasons counted, the versions compared); the trainer stops on it or skips it
  (``empty_steps``, :mod:`dressage.training.steps`), never commits it silently.
* :class:`CollapseWatch` follows the backend's metrics step by step and warns when the policy's
  mean entropy stays below ``entropy_below`` or ``grad_norm`` stays at most ``grad_norm_at_most``
  for ``after_steps`` consecutive steps: a (nearly) deterministic policy whose groups no longer
  differ in reward, so GRPO's advantages and the gradient vanish. It warns once per such streak.

Warnings are returned to the trainer, which records them in the step's manifest (``warnings``),
logs them (logger ``dressage.training``) and hands them to its caller (``StepResult.warnings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dressage.training.masking import reason_counts
from dressage.training.steps import StepBatch, StepOptions


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def empty_step_reason(batch: StepBatch, options: StepOptions) -> str:
    """Why ``batch`` trains no token: its response tokens by mask reason and the versions compared."""
    masked = reason_counts(batch.samples)
    policy = options.masking
    versions = [int(v) for s in batch.samples for v in s.version_counts()]
    span = f"{min(versions)}..{max(versions)}" if versions else "none"
    why = (
        f"step {batch.step} would train 0 tokens: its {sum(masked.values())} response tokens are all "
        f"masked ({_counts(masked)}); data policy versions {span}"
    )
    if masked.get("stale"):
        against = (
            f"trainer version {batch.trainer_version}"
            if policy.staleness_reference == "trainer"
            else f"the newest version of the data consumed so far, {batch.data_version}"
        )
        why += (
            f", staleness measured against {against} with max_staleness {policy.max_staleness} "
            f"(staleness_reference {policy.staleness_reference})"
        )
    return why


def skipped_warning(batch: StepBatch) -> str | None:
    """The warning for the empty-step groups a ``skip`` consumed before ``batch``; None without any."""
    skipped = batch.skipped_groups
    if not skipped:
        return None
    return (
        f"step {batch.step}: skipped {_skipped(skipped)}; they are listed in the manifest as "
        f"{skipped[0]['reason']}"
    )


def unformed_warning(skipped: list[dict[str, Any]]) -> str | None:
    """The warning for empty-step groups a ``skip`` consumed where no further step could form."""
    if not skipped:
        return None
    return (
        f"skipped {_skipped(skipped)}; no step after them could be formed yet, so no manifest lists "
        "them (they are skipped again when one is)"
    )


def _skipped(skipped: list[dict[str, Any]]) -> str:
    masked: dict[str, int] = {}
    for g in skipped:
        for name, n in g.get("mask_reasons", {}).items():
            masked[name] = masked.get(name, 0) + int(n)
    tasks = ", ".join(str(g["task_index"]) for g in skipped)
    return (
        f"{len(skipped)} group(s) (tasks {tasks}) whose steps would train 0 tokens "
        f"(masked: {_counts(masked)}; empty_steps: skip)"
    )


@dataclass
class CollapseWatch:
    """Consecutive steps of collapsed entropy or zero gradient (see the module docstring)."""

    entropy_below: float | None = 0.1
    grad_norm_at_most: float | None = 0.0
    after_steps: int = 2
    _streaks: dict[str, list[int]] = field(default_factory=dict)

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[str]:
        """Count ``step``'s metrics; the warnings due now (each streak warns once, when it reaches
        ``after_steps``). A step without the metric (a backend that does not measure it) ends no streak."""
        out: list[str] = []
        entropy, grad = metrics.get("entropy"), metrics.get("grad_norm")
        if self.entropy_below is not None and entropy is not None:
            if self._streak("entropy", step, entropy < self.entropy_below):
                out.append(
                    f"policy entropy collapsed: {entropy:.3g} nats < {self.entropy_below:g} "
                    f"(warn_entropy_below) for {self.after_steps} consecutive steps "
                    f"({self._span('entropy')}): the policy is (nearly) deterministic, its samples stop "
                    "differing in reward and GRPO's advantages vanish"
                )
        if self.grad_norm_at_most is not None and grad is not None:
            if self._streak("grad_norm", step, grad <= self.grad_norm_at_most):
                out.append(
                    f"grad_norm {grad:.3g} <= {self.grad_norm_at_most:g} (warn_grad_norm_at_most) for "
                    f"{self.after_steps} consecutive steps ({self._span('grad_norm')}): the steps change "
                    "no weight (every group's rewards equal, so every advantage is 0, or no token trained)"
                )
        return out

    def _streak(self, name: str, step: int, hit: bool) -> bool:
        """Extend or end ``name``'s streak; True when it has just reached ``after_steps``."""
        steps = self._streaks.setdefault(name, [])
        if not hit:
            steps.clear()
            return False
        steps.append(step)
        return len(steps) == self.after_steps

    def _span(self, name: str) -> str:
        steps = self._streaks[name]
        return f"steps {steps[0]}-{steps[-1]}"
