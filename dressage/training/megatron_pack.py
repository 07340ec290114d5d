"""THD packing for Megatron: samples concatenated into one sequence with ``cu_seqlens``.

Each sample ``i`` of ``L_i`` tokens is padded to ``P_i = ceil(L_i / m) * m`` (``m`` =
``pad_multiple``, e.g. ``2 * cp_size * tp_size`` for context/sequence parallelism) and placed at
``cu_seqlens[i] .. cu_seqlens[i] + P_i`` of the packed ``[T]`` arrays, ``T = sum_i P_i``.
Per-token training arrays (loss weights, rollout logprobs, advantages) are laid out on the
*predicted* token: position ``p`` of sample ``i`` carries the values of token ``p + 1`` (the
label), so ``labels_T[p] = tokens_T[p + 1]`` inside a sample and padding has weight 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dressage.errors import TrainingError
from dressage.training.samples import TrainSample


@dataclass
class PackedTHD:
    """One packed micro-batch (``T`` tokens, ``n`` samples)."""

    tokens_T: np.ndarray  # int64
    labels_T: np.ndarray  # int64, -100 where nothing is predicted
    position_ids_T: np.ndarray  # int64, restart at 0 per sample
    loss_weights_T: np.ndarray  # float32
    rollout_log_probs_T: np.ndarray  # float32
    advantages_T: np.ndarray  # float32
    cu_seqlens: np.ndarray  # int32 [n + 1], padded lengths
    seqlens: np.ndarray  # int32 [n], unpadded lengths


def pack_thd(samples: Sequence[TrainSample], pad_multiple: int = 1, pad_token_id: int = 0) -> PackedTHD:
    """Pack ``samples`` (with ``loss_weights`` assigned) into THD layout."""
    if pad_multiple < 1:
        raise TrainingError(f"pad_multiple must be >= 1, got {pad_multiple}")
    lengths = np.asarray([s.tokens.shape[0] for s in samples], dtype=np.int64)
    padded = -(-lengths // pad_multiple) * pad_multiple
    cu = np.zeros(len(samples) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(padded)
    total = int(cu[-1])
    tokens_T = np.full(total, pad_token_id, dtype=np.int64)
    labels_T = np.full(total, -100, dtype=np.int64)
    pos_T = np.zeros(total, dtype=np.int64)
    weights_T = np.zeros(total, dtype=np.float32)
    logp_T = np.zeros(total, dtype=np.float32)
    adv_T = np.zeros(total, dtype=np.float32)
    for s, start, length, plen in zip(samples, cu[:-1], lengths, padded, strict=True):
        if s.loss_weights is None:
            raise TrainingError(
                f"session {s.session_id} segment {s.segment_index}: loss weights not assigned"
            )
        start, length = int(start), int(length)
        tokens_T[start : start + length] = s.tokens
        labels_T[start : start + length - 1] = s.tokens[1:]
        pos_T[start : start + int(plen)] = np.arange(int(plen))
        r0 = start + length - 1 - s.response_length  # predicting position of the first response token
        weights_T[r0 : r0 + s.response_length] = s.loss_weights
        logp_T[r0 : r0 + s.response_length] = s.rollout_log_probs
        adv_T[r0 : r0 + s.response_length] = s.advantage
    return PackedTHD(tokens_T, labels_T, pos_T, weights_T, logp_T, adv_T, cu, lengths.astype(np.int32))
