"""``slime.rollout.base_types`` as seen by a rollout function (interface of slime 624b824a)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.utils.types import Sample


@dataclass
class RolloutFnTrainOutput:
    """What a training rollout returns: samples (possibly nested) and optional metrics."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    """What an evaluation rollout returns."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def call_rollout_fn(fn: Callable[..., Any], *args: Any, evaluation: bool, **kwargs: Any) -> Any:
    """Call ``fn(*args, evaluation=...)``; wrap a bare return value as the matching output."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    if not isinstance(output, RolloutFnTrainOutput | RolloutFnEvalOutput):
        output = RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
    return output
