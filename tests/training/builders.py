"""Build test runs through the EventStore API: tasks, leases, sessions, turns with segments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.store.records import Turn

if TYPE_CHECKING:
    import torch

    from dressage.training.samples import TrainSample

VOCAB = 4096
LAYERS, TOP_K = 2, 2


@dataclass
class TurnSpec:
    """One turn: ``n_ctx`` context tokens, ``n_gen`` generated ones at ``versions``."""

    n_ctx: int
    n_gen: int
    version: int = 0
    versions: list[int] | None = None
    mask: list[bool] | None = None


@dataclass
class SegmentSpec:
    """One segment of ``turns`` on ``lineage``."""

    lineage: int
    turns: list[TurnSpec]
    boundary_reason: str | None = None


@dataclass
class TrajSpec:
    """A trajectory: its segments in turn order (segments may interleave via ``order``)."""

    reward: float
    segments: list[SegmentSpec]
    status: str = "finished"
    experts: bool = True
    order: list[tuple[int, int]] | None = field(default=None)  # (segment, turn) in turn order


def turn_records(session_id: str, spec: TrajSpec, rng: np.random.Generator) -> list[NewTurn]:
    """The TurnRecords of a trajectory, with consistent offsets and expert rows."""
    order = spec.order or [(si, ti) for si, seg in enumerate(spec.segments) for ti in range(len(seg.turns))]
    offsets = [0] * len(spec.segments)
    records = []
    for turn_index, (si, ti) in enumerate(order):
        seg, t = spec.segments[si], spec.segments[si].turns[ti]
        off = offsets[si]
        versions = t.versions or [t.version] * t.n_gen
        rows = t.n_ctx + t.n_gen - (1 if off == 0 else 0)
        records.append(
            NewTurn(
                session_id=session_id,
                turn_index=turn_index,
                context_ids=rng.integers(0, VOCAB, t.n_ctx).tolist(),
                generated_ids=rng.integers(0, VOCAB, t.n_gen).tolist(),
                logprobs=(-rng.random(t.n_gen) * 3).astype(np.float32).tolist(),
                policy_versions=versions,
                loss_mask=t.mask,
                thread_index=seg.lineage,
                route="append" if off else "create",
                segment_index=si,
                segment_offset=off,
                boundary_reason=seg.boundary_reason if off == 0 and si else None,
                routed_experts=rng.integers(0, 8, (rows, LAYERS, TOP_K)).astype(np.uint8)
                if spec.experts
                else None,
                finish_reason="stop",
            )
        )
        offsets[si] += t.n_ctx + t.n_gen
    return records


def simple(reward: float, version: int = 0, n_turns: int = 2) -> TrajSpec:
    """A one-segment, root-lineage trajectory."""
    return TrajSpec(reward, [SegmentSpec(0, [TurnSpec(4, 3, version) for _ in range(n_turns)])])


def build_run(
    store: EventStore,
    run: str,
    groups: list[list[TrajSpec | list[TrajSpec]]],
    *,
    seed: int = 0,
    first_task: int = 0,
    config: dict[str, Any] | None = None,
) -> dict[tuple[int, int], list[str]]:
    """Enqueue one task per group, claim and play each sample's attempts in order.

    An entry that is a list holds successive attempts of one (task, sample) pair (e.g. a failed
    one, then a finished retry). Returns the session ids per (task, sample). With ``first_task``
    > 0 the run must exist and the groups are appended as task indexes ``first_task, ...``;
    otherwise the run is created with ``config`` (its recorded config).
    """
    rng = np.random.default_rng(seed)
    n = len(groups[0])
    if first_task == 0:
        store.runs.create(run, config)
    tasks = [TaskSpec(first_task + i, {"prompt": first_task + i}) for i in range(len(groups))]
    store.tasks.enqueue(run, tasks, n_samples=n)
    attempts = {
        (first_task + g, k): (e if isinstance(e, list) else [e])
        for g, grp in enumerate(groups)
        for k, e in enumerate(grp)
    }
    sessions: dict[tuple[int, int], list[str]] = {}
    while True:
        leases = store.tasks.claim(run, "test-worker", n=1)
        if not leases:
            break
        lease = leases[0]
        key = (lease.task_index, lease.sample_index)
        spec = attempts[key][lease.attempt - 1]
        sid = f"{run}-t{key[0]}-s{key[1]}-a{lease.attempt}"
        store.sessions.open(run, session_id=sid, task_id=lease.task_id, attempt=lease.attempt)
        for rec in turn_records(sid, spec, rng):
            store.turns.append(run, rec)
        reward = spec.reward if spec.status == "finished" else None
        store.sessions.finalize(sid, spec.status, reward=reward)
        sessions.setdefault(key, []).append(sid)
        more = lease.attempt < len(attempts[key])
        store.tasks.release(lease, "retry" if more else ("done" if spec.status == "finished" else "failed"))
    return sessions


def make_turn(
    turn_index: int,
    segment: int,
    lineage: int,
    offset: int,
    context: list[int],
    generated: list[int],
    versions: list[int] | None = None,
    experts_rows: int | None = None,
) -> Turn:
    """A :class:`Turn` built in memory (for pure materialization tests)."""
    n = len(generated)
    experts = None
    if experts_rows is not None:
        experts = np.arange(experts_rows * LAYERS * TOP_K, dtype=np.int32).reshape(
            experts_rows, LAYERS, TOP_K
        )
    return Turn(
        id=f"turn-{turn_index}",
        session_id="s",
        turn_index=turn_index,
        thread_index=lineage,
        parent_turn_id=None,
        route="append",
        segment_index=segment,
        segment_offset=offset,
        boundary_reason=None,
        context_ids=np.asarray(context, np.int32),
        generated_ids=np.asarray(generated, np.int32),
        logprobs=-np.arange(1, n + 1, dtype=np.float32) / 10,
        loss_mask=np.ones(n, np.bool_),
        policy_versions=np.asarray(versions or [0] * n, np.int32),
        routed_experts=experts,
        finish_reason="stop",
        sampling_params={},
        request_fingerprint=None,
        content_hash="x",
        latency_ms=None,
        info={},
        position=turn_index + 1,
    )


def recompute_loss_and_grad_norm(
    model: torch.nn.Module, samples: Sequence[TrainSample]
) -> tuple[float, float]:
    """The summed loss and the gradient norm of ``samples`` on ``model``, recomputed by hand.

    Each sample's response log-probs under ``model`` go through the backend's loss function
    (:func:`~dressage.training.torch_backend.ppo_clip_tis_loss`) and are backpropagated; the norm
    is over every parameter that got a gradient (the trainable ones).
    """
    import torch

    from dressage.training.torch_backend import ppo_clip_tis_loss

    total = 0.0
    for s in samples:
        tokens = torch.as_tensor(s.tokens, dtype=torch.long)
        logp = torch.log_softmax(model(input_ids=tokens[None]).logits[0].float()[:-1], dim=-1)
        logp_R = logp.gather(-1, tokens[1:, None])[:, 0][-s.response_length :]
        loss, _ = ppo_clip_tis_loss(
            logp_R,
            torch.as_tensor(s.rollout_log_probs, dtype=torch.float32),
            torch.full((s.response_length,), s.advantage),
            torch.as_tensor(s.loss_weights, dtype=torch.float32),
        )
        loss.backward()
        total += float(loss.detach())
    grads = [p.grad.double().flatten() for p in model.parameters() if p.grad is not None]
    return total, float(torch.linalg.vector_norm(torch.cat(grads)))
