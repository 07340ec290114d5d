"""A step's per-token decisions: each trained sample's advantage, mask reasons, importance weights.

The advantage (:mod:`~dressage.training.advantages`) and the mask reasons
(:func:`~dressage.training.masking.apply_version_mask`) are a pure function of the log, so replay
re-forms them and requires them equal to what was recorded (:func:`decision_drift`). The importance
weights depend on the trainer's weights, like the loss: a backend that computes them sets
``TrainSample.importance_weights`` in its ``train_step`` (the torch backend does; ``none`` and slime's
rollout side do not, and their rows hold NULL), and replay does not recompute them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dressage.errors import TrainingError
from dressage.store.decisions import SampleDecision
from dressage.training.steps import StepBatch


def step_decisions(batch: StepBatch) -> list[SampleDecision]:
    """One :class:`SampleDecision` per sample of ``batch``, in batch order."""
    out = []
    for i, s in enumerate(batch.samples):
        if s.mask_reasons is None:
            raise TrainingError(
                f"session {s.session_id} segment {s.segment_index}: the step has no mask reasons for it "
                "(apply_version_mask was not run)"
            )
        out.append(
            SampleDecision(
                sample=i,
                session_id=s.session_id,
                segment_index=s.segment_index,
                response_start=s.response_start,
                advantage=float(s.advantage),
                mask_reasons=s.mask_reasons,
                importance_weights=s.importance_weights,
            )
        )
    return out


def decision_drift(recorded: Sequence[SampleDecision], batch: StepBatch) -> str | None:
    """How the recorded decisions of a step differ from the re-formed ``batch``'s (None: equal).

    Compares what the log decides (sample keys, advantage bitwise, mask reasons), never the
    importance weights. A step recorded before decisions were stored has none and passes.
    """
    if not recorded:
        return None
    current = step_decisions(batch)
    if len(recorded) != len(current):
        return f"{len(recorded)} samples have decisions recorded, the replayed step has {len(current)}"
    for a, b in zip(recorded, current, strict=True):
        where = f"sample {a.sample} (session {a.session_id} segment {a.segment_index})"
        if (a.session_id, a.segment_index, a.response_start) != (
            b.session_id,
            b.segment_index,
            b.response_start,
        ):
            return f"{where}: now session {b.session_id} segment {b.segment_index} from {b.response_start}"
        if a.advantage != b.advantage:
            return (
                f"{where}: advantage was recorded as {a.advantage!r}, the replayed step gives {b.advantage!r}"
            )
        ra, rb = np.asarray(a.mask_reasons), np.asarray(b.mask_reasons)
        if ra.shape != rb.shape:
            return f"{where}: {ra.size} mask reasons recorded, the replayed step has {rb.size}"
        if not np.array_equal(ra, rb):
            first = int(np.flatnonzero(ra != rb)[0])
            return (
                f"{where}: the mask reason of response token {first} was recorded as "
                f"{int(a.mask_reasons[first])}, the replayed step gives {int(b.mask_reasons[first])}"
            )
    return None
