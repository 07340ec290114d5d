"""The replay trainer: materialize segment-aware samples from the log, form steps, train, replay.

Modules: :mod:`~dressage.training.materialize` (turns → segments → samples),
:mod:`~dressage.training.advantages` (estimator registry, anchor broadcast),
:mod:`~dressage.training.weights` (prompt-equal loss weights), :mod:`~dressage.training.masking`
(version-aware masking), :mod:`~dressage.training.groups` (ready groups from the log),
:mod:`~dressage.training.steps` (step formation and manifest), :mod:`~dressage.training.consumer`
(the ``train:<name>`` consumer and replay), :mod:`~dressage.training.torch_backend`,
:mod:`~dressage.training.megatron_pack`. torch is imported only by the backends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dressage.training.advantages import assign_advantages, get_estimator, register_estimator
    from dressage.training.consumer import NullBackend, Trainer
    from dressage.training.masking import MaskingPolicy
    from dressage.training.materialize import Trajectory, build_segments, materialize_trajectory
    from dressage.training.samples import SLIME_COMMIT, TrainSample
    from dressage.training.steps import StepBatch, StepOptions
    from dressage.training.weights import prompt_equal_weights

_HOMES = {
    "assign_advantages": "advantages",
    "get_estimator": "advantages",
    "register_estimator": "advantages",
    "NullBackend": "consumer",
    "Trainer": "consumer",
    "MaskingPolicy": "masking",
    "Trajectory": "materialize",
    "build_segments": "materialize",
    "materialize_trajectory": "materialize",
    "SLIME_COMMIT": "samples",
    "TrainSample": "samples",
    "StepBatch": "steps",
    "StepOptions": "steps",
    "prompt_equal_weights": "weights",
}
"""Each name's module: imported when the name is first read (PEP 562), so a program that needs one
module of the package (the CLI: ``train``'s option defaults) does not import the store with it."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "SLIME_COMMIT",
    "MaskingPolicy",
    "NullBackend",
    "StepBatch",
    "StepOptions",
    "TrainSample",
    "Trainer",
    "Trajectory",
    "assign_advantages",
    "build_segments",
    "get_estimator",
    "materialize_trajectory",
    "prompt_equal_weights",
    "register_estimator",
]
