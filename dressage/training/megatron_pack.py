"""THD packing for Megatron: samples concatenated into one sequence with ``cu_seqlens``.

Two packers share one alignment rule: per-token training arrays (loss mask and weights, rollout
logprobs, advantages) sit on the *predicting* position, so position ``p`` of sample ``i`` carries
the values of token ``p + 1`` (the label) and the last token of each sample and all padding have
weight 0.

* :func:`pack_thd` (numpy, no torch): every sample padded to a multiple of ``pad_multiple``.
* :func:`pack_megatron` (torch + ``megatron-core``): the layout slime feeds Megatron-core, with a
  real ``megatron.core.packed_seq_params.PackedSeqParams`` and routed experts for routing replay.

What slime does (THUDM/slime at ``624b824a898ab0ec1fcb4d373004c7f3852bf515``, context parallel
size 1, ``slime/backends/megatron_utils/data.py:get_batch`` and ``cp_utils.py``):

* samples are concatenated unpadded; the whole stream is padded at the end to a multiple of
  ``tp_size * --data-pad-size-multiplier`` (default 128) with token 0, and the padding is appended
  to ``cu_seqlens`` as one more sequence; ``cu_seqlens`` is int32, ``max_seqlen`` the largest
  difference, ``qkv_format="thd"``, tokens ``[1, T]``;
* ``loss_mask`` (``[R]``) is placed with ``F.pad(loss_mask, (prompt_length - 1, 1))``: on the
  predicting positions;
* ``rollout_routed_experts`` (``[L - 1, layers, top_k]`` per sample, checked ``== len(tokens) -
  1``) get one filler row each (for the last token), are concatenated, padded to the same multiple,
  and under sequence parallelism each TP rank takes its contiguous ``T / tp`` rows; filler rows are
  ``arange(rows * layers * top_k) % num_experts`` (valid, distinct ids, spread over experts);
  ``[:, layer]`` is then recorded per MoE layer for replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dressage.errors import NotSupportedError, TrainingError
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
        adv_T[r0 : r0 + s.response_length] = s.advantages if s.advantages is not None else s.advantage
    return PackedTHD(tokens_T, labels_T, pos_T, weights_T, logp_T, adv_T, cu, lengths.astype(np.int32))


# --- Megatron-core packed batches (torch tensors + PackedSeqParams) ---------------------------

MEGATRON_HINT = "pip install megatron-core (or the 'megatron' extra: pip install 'dressage[megatron]')"
SLIME_PAD_MULTIPLIER = 128
"""slime's ``--data-pad-size-multiplier`` default; the stream is padded to ``tp_size * 128``."""


def packed_seq_params_class() -> type:
    """``megatron.core.packed_seq_params.PackedSeqParams``, imported lazily.

    Raises :class:`NotSupportedError` naming the package to install when megatron-core is absent.
    """
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as e:
        raise NotSupportedError(
            f"Megatron packing needs megatron-core, which is not importable here ({e}); {MEGATRON_HINT}"
        ) from e
    return PackedSeqParams


@dataclass
class MegatronBatch:
    """One micro-batch in Megatron-core's THD layout (``T`` packed positions, ``n`` samples).

    Every per-position tensor is ``[1, T]`` (the batch dimension Megatron's GPT model expects with
    ``qkv_format="thd"``) and sits on the *predicting* position: position ``p`` of a sample carries
    the label ``tokens[p + 1]`` and that label's mask, weight, advantage and rollout logprob, as
    slime aligns ``loss_mask`` (``F.pad(loss_mask, (prompt_length - 1, 1))``). Routed experts are
    ``[T, layers, top_k]`` with row ``p`` the route of position ``p``; the last token of each sample
    (it predicts nothing) and all padding get filler routes ``arange % num_experts`` as in slime.
    """

    tokens_1T: Any  # torch.int64
    labels_1T: object  # torch.int64, pad_token_id where nothing is predicted
    position_ids_1T: object  # torch.int64, restart at 0 per sample (and in the tail pad)
    loss_mask_1T: Any  # torch.float32, 0/1
    loss_weights_1T: Any  # torch.float32, prompt-equal weights (0 without assigned weights)
    advantages_1T: Any  # torch.float32
    rollout_log_probs_1T: Any  # torch.float32
    routed_experts_TLK: Any | None  # torch.int32 [T, layers, top_k]
    packed_seq_params: object  # megatron.core.packed_seq_params.PackedSeqParams
    starts: list[int]  # offset of each sample in T
    total_lengths: list[int]  # L_i
    response_lengths: list[int]  # R_i
    n_tail_pad: int  # padding positions appended after the last sample

    @property
    def num_tokens(self) -> int:
        """``T``, a multiple of the pad multiple."""
        return int(self.tokens_1T.shape[1])


def _filler_routes(n_rows: int, layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """Routes for positions without a recorded route: distinct ids per row, spread over experts."""
    return (
        (np.arange(n_rows * layers * top_k, dtype=np.int64) % num_experts)
        .astype(np.int32)
        .reshape(n_rows, layers, top_k)
    )


def pack_megatron(
    samples: Sequence[TrainSample],
    *,
    tp_size: int = 1,
    pad_multiplier: int = SLIME_PAD_MULTIPLIER,
    sample_multiple: int = 1,
    pad_token_id: int = 0,
    num_experts: int | None = None,
    device: str = "cpu",
) -> MegatronBatch:
    """Pack ``samples`` into a :class:`MegatronBatch` the way slime feeds Megatron (CP size 1).

    Samples are concatenated in order, each in a slot of ``ceil(L_i / sample_multiple) *
    sample_multiple`` positions (``sample_multiple`` > 1 for context parallelism, e.g. ``2 * cp``);
    the stream is then padded to a multiple of ``tp_size * pad_multiplier`` and, as in slime, the
    tail padding is one extra pseudo-sequence in ``cu_seqlens``. ``cu_seqlens_q/kv`` hold the
    unpadded lengths, ``cu_seqlens_*_padded`` the slot boundaries (equal when ``sample_multiple``
    is 1); both are int32. ``num_experts`` (for filler routes) defaults to the largest recorded
    expert id + 1. Routed experts are packed only when every sample has them.
    """
    import torch

    params_cls = packed_seq_params_class()
    lengths, slots, starts, tail = _layout(samples, tp_size, pad_multiplier, sample_multiple)
    total = int(starts[-1]) + tail
    arrays = _fill(samples, lengths, slots, starts, total, pad_token_id)
    experts_TLK = _experts(samples, lengths, starts, total, num_experts)

    cu = np.zeros(len(samples) + 1, dtype=np.int64)
    cu[1:] = np.cumsum(lengths)
    cu_real: list[np.int64 | int] = list(cu)
    cu_padded: list[np.int64 | int] = list(starts)
    if tail:
        cu_real.append(cu_real[-1] + tail)
        cu_padded.append(total)
    cu_q = torch.tensor(cu_real, dtype=torch.int32, device=device)
    cu_q_padded = torch.tensor(cu_padded, dtype=torch.int32, device=device)
    max_seqlen = int(np.diff(np.asarray(cu_padded)).max())
    params = params_cls(
        qkv_format="thd",
        cu_seqlens_q=cu_q,
        cu_seqlens_kv=cu_q,
        cu_seqlens_q_padded=cu_q_padded,
        cu_seqlens_kv_padded=cu_q_padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )

    def t(a: np.ndarray) -> Any:
        return torch.from_numpy(a).to(device)[None]

    return MegatronBatch(
        tokens_1T=t(arrays["tokens"]),
        labels_1T=t(arrays["labels"]),
        position_ids_1T=t(arrays["positions"]),
        loss_mask_1T=t(arrays["mask"]),
        loss_weights_1T=t(arrays["weights"]),
        advantages_1T=t(arrays["advantages"]),
        rollout_log_probs_1T=t(arrays["log_probs"]),
        routed_experts_TLK=torch.from_numpy(experts_TLK).to(device) if experts_TLK is not None else None,
        packed_seq_params=params,
        starts=[int(x) for x in starts[:-1]],
        total_lengths=[int(x) for x in lengths],
        response_lengths=[s.response_length for s in samples],
        n_tail_pad=tail,
    )


def _layout(
    samples: Sequence[TrainSample], tp_size: int, pad_multiplier: int, sample_multiple: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(lengths, slots, starts, tail)``: each sample's length and slot, the slots' starts (and the
    end of the last), and the tail padding up to a multiple of ``tp_size * pad_multiplier``."""
    if tp_size < 1 or pad_multiplier < 1 or sample_multiple < 1:
        raise TrainingError(
            f"tp_size ({tp_size}), pad_multiplier ({pad_multiplier}) and sample_multiple "
            f"({sample_multiple}) must all be >= 1"
        )
    if not samples:
        raise TrainingError("pack_megatron needs at least one sample")
    multiple = tp_size * pad_multiplier
    lengths = np.asarray([s.tokens.shape[0] for s in samples], dtype=np.int64)
    if int(lengths.min()) < 2:
        raise TrainingError("every sample needs at least 2 tokens (one prediction)")
    slots = -(-lengths // sample_multiple) * sample_multiple
    starts = np.zeros(len(samples) + 1, dtype=np.int64)
    starts[1:] = np.cumsum(slots)
    used = int(starts[-1])
    return lengths, slots, starts, (multiple - used % multiple) % multiple


def _fill(
    samples: Sequence[TrainSample],
    lengths: np.ndarray,
    slots: np.ndarray,
    starts: np.ndarray,
    total: int,
    pad_token_id: int,
) -> dict[str, np.ndarray]:
    """The packed per-position arrays (tokens, labels, positions, mask, weights, advantages, log-probs)."""
    tokens_T = np.full(total, pad_token_id, dtype=np.int64)
    labels_T = np.full(total, pad_token_id, dtype=np.int64)
    pos_T = np.zeros(total, dtype=np.int64)
    mask_T = np.zeros(total, dtype=np.float32)
    weights_T = np.zeros(total, dtype=np.float32)
    adv_T = np.zeros(total, dtype=np.float32)
    logp_T = np.zeros(total, dtype=np.float32)
    for s, start, length, slot in zip(samples, starts[:-1], lengths, slots, strict=True):
        start, length, resp = int(start), int(length), s.response_length
        end = start + length
        tokens_T[start:end] = s.tokens
        labels_T[start : end - 1] = s.tokens[1:]
        pos_T[start : start + int(slot)] = np.arange(int(slot))
        r0 = end - 1 - resp  # predicting position of the first response token
        mask_T[r0 : end - 1] = s.loss_mask
        if s.loss_weights is not None:
            weights_T[r0 : end - 1] = s.loss_weights
        adv_T[r0 : end - 1] = s.advantages if s.advantages is not None else s.advantage  # a tree: per token
        logp_T[r0 : end - 1] = s.rollout_log_probs
    used = int(starts[-1])
    pos_T[used:] = np.arange(total - used)
    return {
        "tokens": tokens_T,
        "labels": labels_T,
        "positions": pos_T,
        "mask": mask_T,
        "weights": weights_T,
        "advantages": adv_T,
        "log_probs": logp_T,
    }


def _experts(
    samples: Sequence[TrainSample],
    lengths: np.ndarray,
    starts: np.ndarray,
    total: int,
    num_experts: int | None,
) -> np.ndarray | None:
    """Routed experts ``[T, layers, top_k]`` with filler routes on padding, or None unless every
    sample has them."""
    if not all(s.rollout_routed_experts is not None for s in samples):
        return None
    shapes = {s.rollout_routed_experts.shape[1:] for s in samples}  # type: ignore[union-attr]
    if len(shapes) != 1:
        raise TrainingError(f"routed experts differ in [layers, top_k] between samples: {sorted(shapes)}")
    layers, top_k = shapes.pop()
    n_exp = num_experts or 1 + max(int(s.rollout_routed_experts.max()) for s in samples)  # type: ignore[union-attr]
    experts_TLK = _filler_routes(total, layers, top_k, n_exp)
    for s, start, length in zip(samples, starts[:-1], lengths, strict=True):
        start, length = int(start), int(length)
        rows = s.rollout_routed_experts
        assert rows is not None
        if rows.shape[0] != length - 1:
            raise TrainingError(
                f"session {s.session_id} segment {s.segment_index}: {rows.shape[0]} routed-expert rows "
                f"for {length} tokens; expected {length - 1}"
            )
        experts_TLK[start : start + length - 1] = rows
    return experts_TLK


def unpack_megatron(batch: MegatronBatch) -> list[dict[str, np.ndarray]]:
    """Per-sample arrays back out of a packed batch (the inverse of :func:`pack_megatron`).

    Each dict has ``tokens`` ``[L]``, ``loss_mask`` / ``loss_weights`` / ``advantages`` /
    ``rollout_log_probs`` ``[R]`` and, when packed, ``rollout_routed_experts`` ``[L - 1, layers,
    top_k]``: exactly the sample's own fields, which is what the round-trip tests check.
    """
    cols = {
        "tokens": batch.tokens_1T[0].cpu().numpy(),
        "loss_mask": batch.loss_mask_1T[0].cpu().numpy(),
        "loss_weights": batch.loss_weights_1T[0].cpu().numpy(),
        "advantages": batch.advantages_1T[0].cpu().numpy(),
        "rollout_log_probs": batch.rollout_log_probs_1T[0].cpu().numpy(),
    }
    experts = batch.routed_experts_TLK.cpu().numpy() if batch.routed_experts_TLK is not None else None
    out: list[dict[str, np.ndarray]] = []
    for start, length, resp in zip(batch.starts, batch.total_lengths, batch.response_lengths, strict=True):
        end = start + length
        item = {"tokens": cols["tokens"][start:end]}
        for key in ("loss_mask", "loss_weights", "advantages", "rollout_log_probs"):
            item[key] = cols[key][end - 1 - resp : end - 1]
        if experts is not None:
            item["rollout_routed_experts"] = experts[start : end - 1]
        out.append(item)
    return out


def sequence_parallel_shard(x_T: Any, tp_rank: int, tp_size: int) -> object:
    """Rank ``tp_rank``'s contiguous ``T / tp_size`` rows (slime slices routed experts this way
    under sequence parallelism; ``T`` is a multiple of ``tp_size`` by construction)."""
    n = int(x_T.shape[0])
    if n % tp_size:
        raise TrainingError(f"{n} packed positions do not split over {tp_size} tensor-parallel ranks")
    step = n // tp_size
    return x_T[tp_rank * step : (tp_rank + 1) * step]
