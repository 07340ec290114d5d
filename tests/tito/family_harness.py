"""Walk a conversation through TITO request by request and count token mismatches with a reference.

The reference is independent of our code: the family's official template rendered by
``transformers`` (or Mistral's own encoder) and tokenized by the vocabulary the registry package
ships. At every request point (before each assistant turn, and at the end when the conversation
ends with a user or tool turn) the prompt ids that TITO would send and record
(:meth:`SegmentIndex.plan`, the proxy's path) are compared with the reference ids; the assistant
turn is then "generated" (its text in the family's output form, encoded) and recorded, so later
requests go through the incremental path (append / branch) exactly as in the proxy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dressage.tito.incremental import SegmentIndex
from dressage.tito.profiles import ModelProfile

Message = dict[str, Any]
Reference = Callable[[list[Message], list[dict[str, Any]] | None, bool | None], list[int]]
ModelOutput = Callable[[ModelProfile, list[Message], Message, list[dict[str, Any]] | None, bool | None], str]


@dataclass
class WalkResult:
    """Requests compared, token mismatches found (0 when exact), and the routes TITO took."""

    requests: int = 0
    tokens: int = 0
    mismatches: int = 0
    routes: list[str] = field(default_factory=list)
    first_problem: str | None = None


def mismatch_count(got: list[int], want: list[int]) -> int:
    """Positions that differ plus the length difference."""
    return sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))


def request_points(messages: list[Message]) -> list[int]:
    """Prefix lengths at which an agent sends a request: before each assistant turn, and the end."""
    points = [k for k, m in enumerate(messages) if m["role"] == "assistant" and k > 0]
    if messages[-1]["role"] != "assistant":
        points.append(len(messages))
    return points


def walk(
    profile: ModelProfile,
    reference: Reference,
    model_output: ModelOutput,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    thinking: bool | None,
) -> WalkResult:
    """Send every request of ``messages`` through a fresh :class:`SegmentIndex`; compare with ``reference``."""
    index = SegmentIndex(profile)
    out = WalkResult()
    for k in request_points(messages):
        prefix = messages[:k]
        plan = index.plan(prefix, tools, thinking)
        got, want = plan.prompt_ids, reference(prefix, tools, thinking)
        bad = mismatch_count(got, want)
        out.requests += 1
        out.tokens += len(want)
        out.mismatches += bad
        out.routes.append(
            plan.route if plan.boundary_reason is None else f"{plan.route}:{plan.boundary_reason}"
        )
        if bad and out.first_problem is None:
            i = next(
                (j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)),
            )
            tok = profile.tokenizer
            out.first_problem = (
                f"request {k}: first difference at token {i}: ours {tok.decode(got[i : i + 8])!r} "
                f"reference {tok.decode(want[i : i + 8])!r}"
            )
        if k < len(messages):
            text = model_output(profile, prefix, messages[k], tools, thinking)
            index.record(plan, f"t{k}", profile.tokenizer.encode(text))
    return out
