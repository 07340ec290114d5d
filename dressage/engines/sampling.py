"""Token sampling for the CPU dev engine, with SGLang's semantics for params and returned logprobs.

SGLang 0.5.23 (``sglang/srt/layers/sampler.py``, default settings):

* a request is greedy when ``top_k <= 1`` after normalisation (``temperature < 1e-6`` becomes
  ``temperature = 1, top_k = 1``); the token is ``argmax(logits)`` and its logprob comes from
  ``log_softmax(logits)``;
* otherwise logits are divided by ``temperature``, the returned logprob is
  ``log(softmax(logits / T))[token]`` over the full vocabulary (before top-k/top-p/min-p), and the
  token is drawn from the top-k/top-p/min-p renormalised distribution;
* before either, the penalties (``sglang/srt/sampling/penaltylib``, output tokens only) change the
  logits: additive ``- frequency_penalty * count - presence_penalty * (count > 0)``, then the
  repetition penalty scales a seen token's logit (times the penalty when negative, divided when
  positive); a grammar mask (:mod:`dressage.engines.grammar`) comes after the penalties;
* top logprobs (``top_logprobs_num``) are the ``k`` best entries of the same logprob vector the
  sampled token's logprob comes from.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

from dressage.engines.protocol import GREEDY_EPS, SamplingParams
from dressage.errors import RequestError

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class ResolvedSampling:
    """Sampling params after SGLang's normalisation (greedy folded into ``top_k == 1``)."""

    temperature: float
    top_p: float
    top_k: int  # <= 0: whole vocabulary
    min_p: float
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    stop_strs: tuple[str, ...]
    ignore_eos: bool
    seed: int | None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax."""
        return self.top_k == 1

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)


@dataclasses.dataclass(frozen=True)
class SampledToken:
    """One sampled token, its logprob, and the best alternatives (``(token_id, logprob)``) when asked."""

    token: int
    logprob: float
    top: list[tuple[int, float]] | None = None


def resolve_sampling(params: SamplingParams) -> ResolvedSampling:
    """Apply SGLang's defaults and normalisation; reject values SGLang's ``verify`` rejects."""
    temperature = 1.0 if params.temperature is None else params.temperature
    top_k = -1 if params.top_k is None else params.top_k
    if temperature < GREEDY_EPS:
        temperature, top_k = 1.0, 1
    if top_k == 0 or top_k < -1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}", param="top_k")
    min_p = 0.0 if params.min_p is None else params.min_p
    if not 0.0 <= min_p <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {min_p}", param="min_p")
    stop = params.stop
    stop_strs = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return ResolvedSampling(
        temperature=temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_k=top_k,
        min_p=min_p,
        max_new_tokens=128 if params.max_new_tokens is None else params.max_new_tokens,
        stop_token_ids=frozenset(params.stop_token_ids or ()),
        stop_strs=stop_strs,
        ignore_eos=bool(params.ignore_eos),
        seed=params.sampling_seed,
        frequency_penalty=params.frequency_penalty or 0.0,
        presence_penalty=params.presence_penalty or 0.0,
        repetition_penalty=1.0 if params.repetition_penalty is None else params.repetition_penalty,
    )


def request_seed(engine_seed: int, rid: str, sampling_seed: int | None) -> int:
    """The per-request RNG seed: ``sampling_seed`` when given, else derived from engine seed and rid.

    Deriving from the rid makes a rerun with the same rids reproduce the same samples.
    """
    if sampling_seed is not None:
        return sampling_seed
    digest = hashlib.sha256(f"{engine_seed}:{rid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def apply_penalties(logits_V: torch.Tensor, params: ResolvedSampling, output_ids: list[int]) -> torch.Tensor:
    """The logits after SGLang's frequency, presence and repetition penalties over ``output_ids``."""
    import torch

    if not params.penalised or not output_ids:
        return logits_V
    counts_V = torch.bincount(torch.tensor(output_ids), minlength=logits_V.numel())[: logits_V.numel()]
    seen_V = counts_V > 0
    logits_V = (
        logits_V - params.frequency_penalty * counts_V.float() - params.presence_penalty * seen_V.float()
    )
    if params.repetition_penalty != 1.0:
        scaled_V = torch.where(
            logits_V < 0, logits_V * params.repetition_penalty, logits_V / params.repetition_penalty
        )
        logits_V = torch.where(seen_V, scaled_V, logits_V)
    return logits_V


def _top(logprobs_V: torch.Tensor, k: int) -> list[tuple[int, float]] | None:
    """The ``k`` best ``(token_id, logprob)``, masked (``-inf``) entries floored to float32's min as SGLang clamps."""
    import torch

    if k <= 0:
        return None
    values, ids = torch.topk(logprobs_V, min(k, logprobs_V.numel()))
    floor = torch.finfo(torch.float32).min
    return [(int(i), max(float(v), floor)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]


def sample_token(
    logits_V: torch.Tensor, params: ResolvedSampling, generator: torch.Generator, top_logprobs_num: int = 0
) -> SampledToken:
    """Pick the next token from one row of (penalised, masked) logits, with its logprob as SGLang computes it."""
    import torch

    logits_V = logits_V.float()
    if params.greedy:
        token = int(torch.argmax(logits_V))
        greedy_V = torch.log_softmax(logits_V, dim=-1)
        return SampledToken(token, float(greedy_V[token]), _top(greedy_V, top_logprobs_num))
    logprobs_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    probs_V = logprobs_V.exp()
    keep_V = _kept(probs_V, params)
    filtered_V = probs_V if keep_V is None else torch.where(keep_V, probs_V, torch.zeros_like(probs_V))
    token = draw_one(filtered_V / filtered_V.sum(), generator)
    return SampledToken(token, float(logprobs_V[token]), _top(logprobs_V, top_logprobs_num))


def _kept(probs_V: torch.Tensor, params: ResolvedSampling) -> torch.Tensor | None:
    """Which tokens top-k, top-p and min-p keep, or None when they keep every token."""
    import torch

    top_k_cuts = 0 < params.top_k < probs_V.numel()
    if not top_k_cuts and params.top_p >= 1.0 and params.min_p <= 0.0:
        return None
    keep_V = torch.ones_like(probs_V, dtype=torch.bool)
    if top_k_cuts:
        kth = torch.topk(probs_V, params.top_k).values[-1]
        keep_V &= probs_V >= kth
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs_V, descending=True)
        before_S = torch.cumsum(sorted_p, dim=0) - sorted_p  # mass strictly above each token
        keep_sorted = before_S < params.top_p
        keep_V &= torch.zeros_like(keep_V).scatter(0, order, keep_sorted)
    if params.min_p > 0.0:
        keep_V &= probs_V >= probs_V.max() * params.min_p
    return keep_V


def draw_one(probs_V: torch.Tensor, generator: torch.Generator) -> int:
    """``torch.multinomial(probs_V, 1, generator=generator)``: the same token, the generator left in
    the same state, in 40% of its time.

    For one sample, torch's CPU multinomial takes ``argmax(p / q)`` with ``q`` one Exp(1) variate per
    entry, drawn by ``exponential_`` one at a time: a 53-bit uniform ``u`` (two Mersenne Twister
    outputs) and ``-log1p(-u)`` in double, rounded to ``p``'s dtype. That serial loop is ~5 ms over
    the 248k ids of Qwen3.5's vocabulary, most of a sampled token's time. ``uniform_`` on a double
    tensor draws the same ``u`` (the same calls on the generator, so it ends in the same state) in a
    fifth of the time, and the vectorised ``log1p`` that follows differs from the C library's by at
    most an ulp of a double, which the rounding to float32 absorbs: the ids are equal to
    ``torch.multinomial``'s (tests/engines/test_sampling_draw.py compares them, and the generator's
    state, over thousands of distributions and draws), so seeded runs sample what they sampled before.
    Invalid probabilities raise the ``RuntimeError`` that ``torch.multinomial`` raises.
    """
    import torch

    if not bool(((probs_V.max() < float("inf")) & (probs_V.min() >= 0)).item()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if not bool((probs_V.sum() > 0).item()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    u_V = torch.empty(probs_V.shape, dtype=torch.float64).uniform_(0.0, 1.0, generator=generator)
    q_V = torch.log1p(u_V.neg_()).neg_().to(probs_V.dtype)
    return int(torch.argmax(probs_V / q_V))
