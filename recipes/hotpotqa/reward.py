"""HotpotQA's official answer metrics: normalised exact match and token F1.

The normalisation and the F1 follow the official evaluation script (``hotpot_evaluate_v1.py`` of
hotpotqa/hotpot): lower case, punctuation and the articles a/an/the removed, whitespace collapsed;
F1 over the normalised tokens, 0 when either side is yes/no/noanswer and they differ. The config
chooses the metric that is the reward (``options: {metric: em}`` or ``f1``); both are in the details.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from dressage.errors import RewardError
from dressage.rollout.rewards import RewardInput, RewardOutput

_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """The official normalisation: lower, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """The official token F1 of the normalised answers."""
    pred, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    common = Counter(pred.split()) & Counter(gold.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(gold.split())
    return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised answers are equal."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def score(inp: RewardInput, metric: str = "f1") -> RewardOutput:
    """The reward of one episode: ``metric`` (``em`` or ``f1``) of the agent's answer against the
    task's label; the answer is the reply's last non-empty line (a model may reason before it)."""
    if metric not in ("em", "f1"):
        raise RewardError(f"reward option metric must be 'em' or 'f1', got {metric!r}")
    if not isinstance(inp.task.label, str):
        raise RewardError(f"task {inp.task.id or inp.task.index} has no answer (label); HotpotQA needs one")
    lines = [ln for ln in inp.answer.splitlines() if ln.strip()]
    answer = lines[-1].strip() if lines else ""
    em, f1 = exact_match_score(answer, inp.task.label), f1_score(answer, inp.task.label)
    details = {"metric": metric, "em": em, "f1": f1, "answer": answer[:200], "gold": inp.task.label}
    return RewardOutput(em if metric == "em" else f1, details)
