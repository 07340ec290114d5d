"""The training sample: one segment of one trajectory, with slime's ``Sample`` field names.

Field names, shapes and dtypes follow ``slime.utils.types.Sample`` at THUDM/slime commit
``624b824a898ab0ec1fcb4d373004c7f3852bf515``:

==========================  ===========================================  ==================================
slime field                 here                                         shape / dtype
==========================  ===========================================  ==================================
``tokens``                  every token of the segment                   ``[L]`` int (list[int] in slime)
``response_length``         tokens from the first trained token on       int ``R``
``loss_mask``               1 = trained                                  ``[R]`` int (list[int])
``rollout_log_probs``       engine logprob; ``0.0`` on context tokens    ``[R]`` float (list[float])
                            (slime's ``append_response_tokens`` pads
                            non-trainable tokens with 0.0)
``rollout_routed_experts``  expert ids covering positions 0..L-2         ``[L-1, layers, top_k]`` int32
``reward``                  the trajectory's reward                      float
``status``                  ``completed|truncated|aborted|failed``       str (``Sample.Status`` value)
``index``                   the trajectory (siblings share it, as in     int
                            slime's ``TrajectoryManager.to_sample``)
``group_index``             the task's group                             int
``rollout_id``              shared by every segment of one trajectory    int
==========================  ===========================================  ==================================

The provenance fields (session, segment, token ranges, turn ids, how many generated tokens each
policy version produced, the masking counts) go into the step manifest; the per-token versions
themselves stay in the log (``turns.policy_versions``, the ``token_events`` view).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
"""The THUDM/slime commit whose ``Sample`` these field names and shapes were checked against."""


@dataclass
class TrainSample:
    """One segment ready for training (``L`` tokens, ``R`` response tokens)."""

    tokens: np.ndarray  # [L] int32
    response_length: int  # R
    loss_mask: np.ndarray  # [R] int32 (0/1), after version-aware masking
    rollout_log_probs: np.ndarray  # [R] float32, 0.0 where the policy did not generate
    rollout_routed_experts: np.ndarray | None  # [L-1, layers, top_k] int32
    reward: float
    status: str
    index: int
    group_index: int
    rollout_id: int
    # --- provenance and training state (not slime fields) ---
    session_id: str
    segment_index: int
    thread_index: int
    is_anchor: bool
    turn_ids: list[str]
    policy_versions: np.ndarray  # [R] int32, -1 where the policy did not generate
    stored_loss_mask: np.ndarray  # [R] bool, the mask as the proxy recorded it
    advantage: float = 0.0
    advantages: np.ndarray | None = None  # [R] float32, per-token advantages (a tree's nodes), else None
    loss_weights: np.ndarray | None = None  # [R] float32, prompt-equal weights of its step
    masking: dict[str, int] = field(default_factory=dict)
    mask_reasons: np.ndarray | None = None  # [R] uint8, why each token is masked (masking.MASK_REASONS)
    importance_weights: np.ndarray | None = None  # [R] float32, set by a backend that computes them

    @property
    def response_start(self) -> int:
        """Index in ``tokens`` of the first response token (``L - R``)."""
        return int(self.tokens.shape[0]) - self.response_length

    @property
    def n_trainable(self) -> int:
        """Number of tokens with ``loss_mask == 1``."""
        return int(self.loss_mask.sum())

    def tensors(self) -> dict[str, np.ndarray]:
        """The exact arrays the batch hash covers, by name, in a fixed order."""
        out: dict[str, np.ndarray] = {
            "tokens": np.ascontiguousarray(self.tokens, dtype=np.int32),
            "loss_mask": np.ascontiguousarray(self.loss_mask, dtype=np.int32),
            "rollout_log_probs": np.ascontiguousarray(self.rollout_log_probs, dtype=np.float32),
            "reward": np.asarray([self.reward], dtype=np.float64),
            "advantage": np.asarray([self.advantage], dtype=np.float32),
            "ids": np.asarray(
                [self.response_length, self.index, self.group_index, self.rollout_id], dtype=np.int64
            ),
        }
        if self.advantages is not None:
            out["advantages"] = np.ascontiguousarray(self.advantages, dtype=np.float32)
        if self.loss_weights is not None:
            out["loss_weights"] = np.ascontiguousarray(self.loss_weights, dtype=np.float32)
        if self.rollout_routed_experts is not None:
            out["rollout_routed_experts"] = np.ascontiguousarray(self.rollout_routed_experts, dtype=np.int32)
        return out

    def describe(self) -> dict[str, object]:
        """Provenance for the manifest (without hashes)."""
        return {
            "session": self.session_id,
            "segment": self.segment_index,
            "lineage": self.thread_index,
            "anchor": self.is_anchor,
            "turns": list(self.turn_ids),
            "tokens": int(self.tokens.shape[0]),
            "response": [self.response_start, int(self.tokens.shape[0])],
            "rollout_id": self.rollout_id,
            "group_index": self.group_index,
            "versions": self.version_counts(),
            "masking": dict(self.masking),
        }

    def version_counts(self) -> dict[str, int]:
        """How many generated response tokens each policy version produced (``{"3": 40, "4": 12}``)."""
        generated_R = self.policy_versions[self.policy_versions >= 0]
        if generated_R.size and generated_R.min() == generated_R.max():  # the usual case: one version
            return {str(int(generated_R[0])): int(generated_R.size)}
        values, counts = np.unique(generated_R, return_counts=True)
        return {str(int(v)): int(n) for v, n in zip(values, counts, strict=True)}
