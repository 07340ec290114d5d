"""Token sampling for the CPU dev engine, with SGLang's semantics for params and returned logprobs.

SGLang 0.5.23 (``sglang/srt/layers/sampler.py``, default settings):

* a request is greedy when ``top_k <= 1`` after normalisation (``temperature < 1e-6`` becomes
  ``temperature = 1, top_k = 1``); the token is ``argmax(logits)`` and its logprob comes from
  ``log_softmax(logits)``;
* otherwise logits are divided by ``temperature``, the returned logprob is
  ``log(softmax(logits / T))[token]`` over the full vocabulary (before top-k/top-p/min-p), and the
  token is drawn from the top-k/top-p/min-p renormalised distribution.
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

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax."""
        return self.top_k == 1


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
    )


def request_seed(engine_seed: int, rid: str, sampling_seed: int | None) -> int:
    """The per-request RNG seed: ``sampling_seed`` when given, else derived from engine seed and rid.

    Deriving from the rid makes a rerun with the same rids reproduce the same samples.
    """
    if sampling_seed is not None:
        return sampling_seed
    digest = hashlib.sha256(f"{engine_seed}:{rid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sample_token(
    logits_V: torch.Tensor, params: ResolvedSampling, generator: torch.Generator
) -> tuple[int, float]:
    """Pick the next token from one row of logits; return ``(token_id, logprob)`` as SGLang does."""
    import torch

    logits_V = logits_V.float()
    if params.greedy:
        token = int(torch.argmax(logits_V))
        return token, float(torch.log_softmax(logits_V, dim=-1)[token])
    logprobs_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    probs_V = logprobs_V.exp()
    keep_V = torch.ones_like(probs_V, dtype=torch.bool)
    if 0 < params.top_k < probs_V.numel():
        kth = torch.topk(probs_V, params.top_k).values[-1]
        keep_V &= probs_V >= kth
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs_V, descending=True)
        before_S = torch.cumsum(sorted_p, dim=0) - sorted_p  # mass strictly above each token
        keep_sorted = before_S < params.top_p
        keep_V &= torch.zeros_like(keep_V).scatter(0, order, keep_sorted)
    if params.min_p > 0.0:
        keep_V &= probs_V >= probs_V.max() * params.min_p
    filtered_V = torch.where(keep_V, probs_V, torch.zeros_like(probs_V))
    token = int(torch.multinomial(filtered_V / filtered_V.sum(), 1, generator=generator))
    return token, float(logprobs_V[token])
