"""One turn from request to log: plan the prompt ids, guard the context window, record the turn.

:func:`prepare_turn` routes a request through the session's lineage index and sizes the
generation to the context window; :func:`record_turn` commits the generated ids to the index and
appends the turn to the log in one transaction (in a worker thread: the store is synchronous),
before any reply leaves. If the append fails the session's cached state is evicted, so the next
request rebuilds it from what the log really holds.

Per-turn store fields: ``context_ids`` are the new prompt ids of an ``append`` (the TITO delta)
or the whole prompt of a segment's first turn (``create``/``branch``); ``info["tito"]`` keeps
what a restarted proxy needs to rebuild the lineage index (TITO lineage id, fork point, where
the delta starts in ``context_ids``, tools key, header length, system key).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dressage.engines import SamplingParams
from dressage.errors import (
    AuthError,
    ContextLengthExceededError,
    DressageError,
    InvalidRecordError,
    StoreError,
)
from dressage.proxy.generation import Coordinator, Generation
from dressage.proxy.requests import ChatRequest
from dressage.proxy.sessions import ReplyData, SegmentState, SessionRegistry, SessionState, system_key
from dressage.redact import redact
from dressage.store import EventStore, TurnRecord, deterministic_key
from dressage.tito import TitoPlan
from dressage.tito.tool_calls import ToolCallFailure

log = logging.getLogger("dressage.proxy")


@dataclass
class TurnJob:
    """A request between planning and recording."""

    state: SessionState
    req: ChatRequest
    plan: TitoPlan
    prompt_ids: Sequence[int]
    generation: Generation
    idem_key: str | None
    context_window: int
    capped: bool
    started: float
    plan_seconds: float
    dedupe_keys: list[str] = field(default_factory=list)


def _experts_start(state: SessionState, plan: TitoPlan) -> int:
    """First segment position whose routing this turn must return (see the store's convention)."""
    if plan.route != "append":
        return 0
    seg = state.segments.get(plan.lineage_id)
    return max(seg.length - 1, 0) if seg is not None else 0


def prepare_turn(
    state: SessionState,
    req: ChatRequest,
    *,
    coordinator: Coordinator,
    client: Any,
    context_window: int,
    record_experts: bool,
    idem_key: str | None,
    started: float,
) -> TurnJob:
    """Plan the prompt ids and size the generation; raises ContextLengthExceededError when it cannot fit."""
    t0 = time.perf_counter()
    plan = state.index.plan(req.messages, req.tools, req.enable_thinking)
    prompt_ids = plan.prompt  # a view: the id list is built only for the engine request
    room = context_window - len(prompt_ids)
    if room <= 0:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {context_window} tokens. However, your messages "
            f"resulted in {len(prompt_ids)} tokens. Please reduce the length of the messages."
        )
    max_new = room if req.max_tokens is None else min(req.max_tokens, room)
    capped = req.max_tokens is None or req.max_tokens > room
    sampling = SamplingParams(
        max_new_tokens=max_new,
        **req.sampling,
    )
    gen = Generation(
        coordinator=coordinator,
        client=client,
        prompt_ids=prompt_ids,
        sampling=sampling,
        rid=f"dr-{uuid.uuid4().hex}",
        experts_start=_experts_start(state, plan) if record_experts else None,
    )
    return TurnJob(
        state=state,
        req=req,
        plan=plan,
        prompt_ids=prompt_ids,
        generation=gen,
        idem_key=idem_key,
        context_window=context_window,
        capped=capped,
        started=started,
        plan_seconds=time.perf_counter() - t0,
    )


async def record_overflow(store: EventStore, state: SessionState, stage: str, info: dict[str, Any]) -> None:
    """Append a ``context_overflow`` event (prompt refused, or generation cut by the window)."""
    payload = {"stage": stage, **info}
    try:
        await asyncio.to_thread(
            store.append_event, state.run_name, "context_overflow", payload, session_id=state.session_id
        )
    except DressageError as e:
        log.warning("could not record context_overflow for session %s: %s", state.session_id, e)


def _store_fields(state: SessionState, job: TurnJob, turn_id: str, n_gen: int) -> dict[str, Any]:
    """Commit the plan to the index and derive segment/lineage fields (mutates ``state``)."""
    plan = job.plan
    rec = state.index.record(plan, turn_id, job.generation.ids)
    skey = system_key(job.req.messages)
    if rec.route == "append":
        seg = state.segments[rec.lineage_id]
        context = list(plan.delta_ids)
        delta_start = 0
    else:
        if rec.route == "branch":
            parent = state.segments.get(plan.parent_lineage_id or "")
            lineage = parent.lineage_index if parent is not None else 0
        elif skey in state.lineage_by_system:
            lineage = state.lineage_by_system[skey]
        else:
            lineage = max(state.lineage_by_system.values(), default=-1) + 1
        state.lineage_by_system.setdefault(skey, lineage)
        seg = SegmentState(state.next_segment, lineage, 0)
        state.next_segment += 1
        state.segments[rec.lineage_id] = seg
        context = list(job.prompt_ids)
        delta_start = len(context) - len(rec.delta_ids)
    offset = seg.length
    seg.length = offset + len(context) + n_gen
    return {
        "rec": rec,
        "segment": seg,
        "offset": offset,
        "context": context,
        "tito": {
            "lineage": rec.lineage_id,
            "fork_at": rec.fork_at,
            "delta_start": delta_start,
            "tools_key": rec.tools_key,
            "header_len": rec.header_len,
            "system_key": skey,
        },
    }


async def record_turn(
    store: EventStore,
    registry: SessionRegistry,
    job: TurnJob,
    failures: list[ToolCallFailure],
    secrets: tuple[str, ...],
) -> ReplyData:
    """Append the turn durably and index it for dedupe; returns the reply data."""
    state, gen = job.state, job.generation
    assert gen.finish is not None
    matched = gen.finish.matched if isinstance(gen.finish.matched, str) else None
    stop_reason = "length" if gen.finish.type == "length" else "stop"
    hit_window = (
        stop_reason == "length" and job.capped and len(job.prompt_ids) + len(gen.ids) >= job.context_window
    )
    async with state.lock:
        if state.finished:
            raise AuthError(
                f"session {state.session_id} was finalized during generation; nothing was recorded"
            )
        turn_index = state.next_turn
        turn_id = deterministic_key(state.run_name, state.session_id, "turn", turn_index)
        f = _store_fields(state, job, turn_id, len(gen.ids))
        state.next_turn += 1
        experts = gen.experts
        expected = len(f["context"]) + len(gen.ids) - (1 if f["offset"] == 0 else 0)
        info: dict[str, Any] = {"tito": f["tito"], "created": int(time.time()), "engine_rid": gen.rid}
        if experts is not None and experts.shape[0] != expected:
            info["experts_dropped"] = f"engine returned {experts.shape[0]} rows, expected {expected}"
            experts = None
        if matched:
            info["matched_stop"] = matched
        if job.idem_key:
            info["idempotency_key"] = job.idem_key
        if job.req.ignored:
            info["ignored_params"] = job.req.ignored
        if gen.resumes:
            info["resumes"] = gen.resumes
        if hit_window:
            info["context_capped"] = True
        if failures:
            info["tool_call_failures"] = [
                {"reason": x.reason, "text": redact(x.text[:2000], secrets)} for x in failures
            ]
        record = TurnRecord(
            session_id=state.session_id,
            turn_index=turn_index,
            context_ids=f["context"],
            generated_ids=gen.ids,
            logprobs=gen.logprobs,
            policy_versions=gen.versions,
            lineage_index=f["segment"].lineage_index,
            parent_turn_id=f["rec"].parent_turn_id,
            route=f["rec"].route,
            segment_index=f["segment"].index,
            segment_offset=f["offset"],
            boundary_reason=f["rec"].boundary_reason,
            routed_experts=experts,
            finish_reason=stop_reason,
            sampling_params={**gen.sampling.to_body(), "model": job.req.model},
            request_fingerprint=job.req.fingerprint,
            latency_ms=(time.perf_counter() - job.started) * 1000.0,
            info=info,
            key=turn_id,
        )
        try:
            await store.append_turn_async(state.run_name, record)
        except InvalidRecordError as e:
            registry.evict(state.session_id)
            session = await asyncio.to_thread(store.get_session, state.session_id)
            if session.status != "running":
                raise AuthError(
                    f"session {state.session_id} is {session.status}; nothing was recorded"
                ) from e
            raise
        except StoreError:
            registry.evict(state.session_id)
            raise
        reply = ReplyData(
            turn_index=turn_index,
            turn_id=turn_id,
            generated_ids=list(gen.ids),
            logprobs=list(gen.logprobs),
            stop_reason=stop_reason,
            matched_stop=matched,
            prompt_tokens=f["offset"] + len(f["context"]),
            created=info["created"],
            rid=gen.rid,
        )
        extends = f["rec"].parent_turn_id if f["rec"].fork_at == "end" else None
        state.remember(reply, job.req.fingerprint, job.idem_key, extends)
    if hit_window:
        await record_overflow(
            store,
            state,
            "generation",
            {"turn_id": turn_id, "prompt_tokens": len(job.prompt_ids), "context_window": job.context_window},
        )
    return reply
