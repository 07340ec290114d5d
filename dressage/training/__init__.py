"""The replay trainer: materialize segment-aware samples from the log, form steps, train, replay.

Modules: :mod:`~dressage.training.materialize` (turns → segments → samples),
:mod:`~dressage.training.advantages` (estimator registry, anchor broadcast),
:mod:`~dressage.training.weights` (prompt-equal loss weights), :mod:`~dressage.training.masking`
(version-aware masking), :mod:`~dressage.training.groups` (ready groups from the log),
:mod:`~dressage.training.steps` (step formation and manifest), :mod:`~dressage.training.consumer`
(the ``train:<name>`` consumer and replay), :mod:`~dressage.training.torch_backend`,
:mod:`~dressage.training.megatron_pack`. torch is imported only by the backends.
"""

from dressage.training.advantages import assign_advantages, get_estimator, register_estimator
from dressage.training.consumer import NullBackend, Trainer
from dressage.training.masking import MaskingPolicy
from dressage.training.materialize import Trajectory, build_segments, materialize_trajectory
from dressage.training.samples import SLIME_COMMIT, TrainSample
from dressage.training.steps import StepBatch, StepOptions
from dressage.training.weights import prompt_equal_weights

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
