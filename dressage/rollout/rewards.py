"""Rewards: a registry of scorers selected by the ``reward:`` config section.

Built in: ``exact_match``, ``normalized_match``, ``contains``, ``length`` (simple answer properties,
for tasks a tiny model can learn), ``tests`` (write the task's hidden tests into the sandbox, run a
command, reward 1 when it passes) and ``python`` (your function, by dotted path). A task kind brings
its own (``harbor``: a Harbor task's own tests and reward file, :mod:`dressage.harbor.verifier`),
registered with :func:`register_reward`; the config model of each is part of the ``reward:`` section here. A scorer returns
a :class:`RewardOutput`; the worker appends it as a ``reward`` event (value plus details) before it
finalizes the session.
"""

from __future__ import annotations

import inspect
import math
import re
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dressage.agents.base import AgentResult, Task
from dressage.agents.config import dotted_path
from dressage.agents.whitebox import import_object
from dressage.errors import RewardError
from dressage.paddock import Sandbox
from dressage.redact import redacted_tail

TAIL_CHARS = 2000


@dataclass
class RewardInput:
    """What a scorer sees: the task, the agent's answer and result, and the live sandbox."""

    task: Task
    answer: str
    result: AgentResult
    sandbox: Sandbox
    fresh_sandbox: Callable[[], Awaitable[Sandbox]] | None = None
    """Starts another sandbox of the same task (Harbor's separate verifier); the caller of it terminates it."""


@dataclass
class RewardOutput:
    """A finite reward and JSON details explaining it (stored in the ``reward`` event).

    ``reward`` None: the scorer kept every value the task wrote (in ``details``) but none of them is
    the one number that trains; ``details["no_scalar_reward"]`` says why (the session finishes with a
    NULL reward, which training refuses with that message)."""

    reward: float | None
    details: dict[str, Any] = field(default_factory=dict)


# --- config models ------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExactMatchConfig(_Strict):
    """1.0 when the stripped answer equals the stripped label."""

    kind: Literal["exact_match"] = "exact_match"


class NormalizedMatchConfig(_Strict):
    """1.0 when answer and label agree after case folding, whitespace and punctuation normalisation
    (the whole answer or its last non-empty line)."""

    kind: Literal["normalized_match"] = "normalized_match"


class ContainsConfig(_Strict):
    """Fraction of the label's strings found in the answer (a single string: 0 or 1)."""

    kind: Literal["contains"] = "contains"
    case_sensitive: bool = False


class LengthConfig(_Strict):
    """1.0 for a non-empty answer of at most ``max_chars`` characters, decaying as ``max_chars / len``."""

    kind: Literal["length"] = "length"
    max_chars: int = Field(default=20, ge=1)


class TestsConfig(_Strict):
    """Write ``task.tests`` into the sandbox and run ``command``; 1.0 when it exits 0 in time."""

    kind: Literal["tests"] = "tests"
    command: str | None = Field(
        default=None, description="Shell command; default: the task's metadata.test_command."
    )
    timeout_s: float = Field(default=60.0, gt=0)


class HarborRewardConfig(_Strict):
    """A Harbor task's own ``tests/test.sh`` and ``reward.txt``/``reward.json`` (see :mod:`dressage.harbor.verifier`)."""

    kind: Literal["harbor"] = "harbor"
    key: str | None = Field(
        default=None,
        description="The reward.json key that trains, in each task that wrote it (a task without it falls "
        "back to weights, its only value, or its 'reward' key).",
    )
    weights: dict[str, float] | None = Field(
        default=None,
        description="Train on the weighted sum of these reward.json keys, in each task that wrote them all.",
    )

    @field_validator("weights")
    @classmethod
    def _some(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and (not v or not all(math.isfinite(w) for w in v.values())):
            raise ValueError("weights must name at least one key with a finite weight")
        return v


class PythonRewardConfig(_Strict):
    """``fn(RewardInput, **options)`` returning a float, ``(float, details)`` or a RewardOutput."""

    kind: Literal["python"] = "python"
    path: Annotated[str, dotted_path("mypkg.rewards:score")]
    options: dict[str, Any] = Field(default_factory=dict)


RewardConfig = Annotated[
    ExactMatchConfig
    | NormalizedMatchConfig
    | ContainsConfig
    | LengthConfig
    | TestsConfig
    | HarborRewardConfig
    | PythonRewardConfig,
    Field(discriminator="kind"),
]
"""The ``reward:`` section: pick one ``kind``."""


# --- scorers ------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Case-fold, NFKC, drop surrounding punctuation and thousands separators, collapse whitespace."""
    text = unicodedata.normalize("NFKC", str(text)).casefold().strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"\s+", " ", text)
    return text.strip(" \t.,;:!?\"'`()[]{}")


def _label_strings(task: Task) -> list[str]:
    label = task.label
    if label is None:
        raise RewardError(f"task {task.index} has no label; this reward needs one")
    return [str(x) for x in label] if isinstance(label, list) else [str(label)]


async def _exact(cfg: ExactMatchConfig, inp: RewardInput) -> RewardOutput:
    labels = _label_strings(inp.task)
    ok = inp.answer.strip() in [x.strip() for x in labels]
    return RewardOutput(1.0 if ok else 0.0, {"matched": ok})


async def _normalized(cfg: NormalizedMatchConfig, inp: RewardInput) -> RewardOutput:
    labels = {normalize_answer(x) for x in _label_strings(inp.task)}
    lines = [ln for ln in inp.answer.splitlines() if ln.strip()]
    candidates = [normalize_answer(inp.answer)] + ([normalize_answer(lines[-1])] if lines else [])
    ok = any(c in labels for c in candidates)
    return RewardOutput(1.0 if ok else 0.0, {"matched": ok, "normalized_answer": candidates[0][:200]})


async def _contains(cfg: ContainsConfig, inp: RewardInput) -> RewardOutput:
    labels = _label_strings(inp.task)
    hay = inp.answer if cfg.case_sensitive else inp.answer.casefold()
    found = [x for x in labels if (x if cfg.case_sensitive else x.casefold()) in hay]
    return RewardOutput(len(found) / len(labels), {"found": found, "answer_chars": len(inp.answer)})


async def _length(cfg: LengthConfig, inp: RewardInput) -> RewardOutput:
    n = len(inp.answer.strip())
    reward = 0.0 if n == 0 else min(1.0, cfg.max_chars / n)
    return RewardOutput(reward, {"answer_chars": n, "max_chars": cfg.max_chars})


async def _tests(cfg: TestsConfig, inp: RewardInput) -> RewardOutput:
    command = cfg.command or inp.task.metadata.get("test_command")
    if not command:
        raise RewardError(
            f"task {inp.task.index}: reward 'tests' needs reward.command or the task's metadata.test_command"
        )
    for path, content in inp.task.tests.items():
        await inp.sandbox.write_file(path, content)
    r = await inp.sandbox.exec(str(command), timeout=cfg.timeout_s)
    details = {
        "command": command,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "stdout_tail": redacted_tail(r.stdout, TAIL_CHARS),
        "stderr_tail": redacted_tail(r.stderr, TAIL_CHARS),
    }
    return RewardOutput(1.0 if r.ok else 0.0, details)


_REGISTERED: dict[str, Callable[[Any, RewardInput], Awaitable[RewardOutput]]] = {}


def register_reward(kind: str, fn: Callable[[Any, RewardInput], Awaitable[RewardOutput]]) -> None:
    """Score reward kind ``kind`` with ``await fn(cfg, inp)``: the rewards a task kind brings,
    registered by :func:`dressage.rollout.task_kinds.register`."""
    _REGISTERED[kind] = fn


class Scorer:
    """A configured reward: ``await scorer.score(inp)`` returns a checked :class:`RewardOutput`."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.kind: str = cfg.kind
        self._fn: Any = None
        if isinstance(cfg, PythonRewardConfig):
            self._fn = import_object(cfg.path, "reward")
            if not callable(self._fn):
                raise RewardError(f"reward {cfg.path!r} is not callable")

    async def score(self, inp: RewardInput) -> RewardOutput:
        """Score one episode; a failing or non-finite reward raises :class:`RewardError` (a None
        reward passes only with its reason in ``details["no_scalar_reward"]``)."""
        builtin: dict[str, Callable[[Any, RewardInput], Awaitable[RewardOutput]]] = {
            "exact_match": _exact,
            "normalized_match": _normalized,
            "contains": _contains,
            "length": _length,
            "tests": _tests,
            **_REGISTERED,
        }
        if self.kind in builtin:
            out = await builtin[self.kind](self.cfg, inp)
        elif not isinstance(self.cfg, PythonRewardConfig):
            raise RewardError(
                f"reward kind {self.kind!r} belongs to a task kind this process has not registered"
            )
        else:
            out = await self._call_python(inp)
        if out.reward is None and isinstance(out.details.get("no_scalar_reward"), str):
            return RewardOutput(None, {"kind": self.kind, **out.details})
        if not isinstance(out.reward, int | float) or not math.isfinite(out.reward):
            raise RewardError(f"reward {self.kind} produced a non-finite value {out.reward!r}")
        return RewardOutput(float(out.reward), {"kind": self.kind, **out.details})

    async def _call_python(self, inp: RewardInput) -> RewardOutput:
        try:
            value = self._fn(inp, **self.cfg.options)
            if inspect.isawaitable(value):
                value = await value
        except RewardError:
            raise
        except Exception as e:  # user code: any failure is a scored-episode failure, reported by name
            raise RewardError(f"reward function {self.cfg.path} raised {type(e).__name__}: {e}") from e
        if isinstance(value, RewardOutput):
            return value
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
            return RewardOutput(value[0], dict(value[1]))
        if isinstance(value, int | float) and not isinstance(value, bool):
            return RewardOutput(float(value))
        raise RewardError(
            f"reward function {self.cfg.path} returned {type(value).__name__}; "
            "return a float, (float, dict) or RewardOutput"
        )


def build_scorer(cfg: Any) -> Scorer:
    """The scorer of a validated ``reward:`` section (python paths are imported here)."""
    return Scorer(cfg)
