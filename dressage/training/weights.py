"""Prompt-equal loss weights, with denominators computed per optimizer step.

For one optimizer step holding prompts (groups) ``p = 1..P``, where prompt ``p`` has samples
``S_p`` (every segment of every kept trajectory) and ``N_p = sum_{s in S_p} sum_t mask_{s,t}``
trainable tokens, the weight of token ``t`` of sample ``s`` in prompt ``p`` is

    w_{s,t} = mask_{s,t} / (P * N_p)

so the step loss ``L = sum_{s,t} w_{s,t} * l_{s,t}`` is the mean over prompts of each prompt's
token mean: every prompt counts equally, and within a prompt long and short samples are averaged
over all of its trainable tokens. Weights of a step sum to 1 (when every prompt has a trainable
token), so splitting a batch into ``k`` optimizer steps keeps each step's loss on the scale of the
whole batch's (no ``1/k`` factor); splitting a step into micro-batches just sums their parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dressage.training.samples import TrainSample


def prompt_equal_weights(masks: Sequence[np.ndarray], prompt_of: Sequence[int]) -> list[np.ndarray]:
    """Weights ``w_R`` for each sample of one optimizer step.

    ``masks[i]`` is sample ``i``'s ``[R_i]`` loss mask and ``prompt_of[i]`` its prompt (group).
    Prompts without a trainable token get zero weight and do not count in ``P``.
    """
    n_per_prompt: dict[int, int] = {}
    for mask_R, p in zip(masks, prompt_of, strict=True):
        n_per_prompt[p] = n_per_prompt.get(p, 0) + int(np.asarray(mask_R).sum())
    n_prompts = sum(1 for n in n_per_prompt.values() if n > 0)
    weights: list[np.ndarray] = []
    for mask_R, p in zip(masks, prompt_of, strict=True):
        mask_R = np.asarray(mask_R, dtype=np.float64)
        n_p = n_per_prompt[p]
        w_R = mask_R / (n_prompts * n_p) if n_p > 0 else np.zeros_like(mask_R)
        weights.append(w_R.astype(np.float32))
    return weights


def assign_loss_weights(step_samples: Sequence[TrainSample]) -> None:
    """Set ``loss_weights`` of every sample of one optimizer step (prompt = ``group_index``)."""
    weights = prompt_equal_weights([s.loss_mask for s in step_samples], [s.group_index for s in step_samples])
    for s, w_R in zip(step_samples, weights, strict=True):
        s.loss_weights = w_R
