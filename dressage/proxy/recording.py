"""One turn from request to log: plan the prompt ids, guard the context window, record the turn.

:func:`prepare_turn` routes a request through the session's segment index and sizes the
generation to the context window; :func:`record_turn` commits the generated ids to the index and
appends the turn to the log in one transaction, before any reply leaves. If the append fails the
session's cached state is evicted, so the next request rebuilds it from what the log really holds.
When another proxy recorded the same turn index first (two proxies racing on one session), the
loser records nothing and answers 409 ``turn_conflict``; the turn index's uniqueness in the log
is what decides.

Per-turn store fields: ``context_ids`` are the new prompt ids of an ``append`` (the TITO delta)
or the whole prompt of a segment's first turn (``create``/``branch``); ``info["tito"]`` keeps
what a restarted proxy needs to rebuild the segment index (TITO segment id, kept under the key ``lineage``; fork point, where
the delta starts in ``context_ids``, tools key, header length, the conversation key of a
``create``, the number of forced ids, ``aborted`` for a turn the client abandoned).

Threads (the log's ``thread_index``, an agent context): a ``branch`` keeps its parent's thread;
a ``create`` joins the thread of the same *conversation* (same system prompt and same first
message after it: a new user turn after thinking, a tools change, a compaction that keeps the
task) and otherwise opens a new one: a subagent that shares only the system prompt (and tools)
with the main agent gets its own thread, so it can never become the trajectory's anchor.

Forced tool calls (``tool_choice`` required / named), thinking on: as SGLang and vLLM do, the model
thinks freely and a grammar (the profile's, sent as SGLang's ``ebnf`` with ``require_reasoning``)
forces a call of the allowed function(s) after ``</think>``; everything is sampled, nothing is
forced into the prompt, and the reply is parsed as any other. Thinking off (or a profile without
such a grammar): the profile's forced opening (Qwen3.5:
``<tool_call>\n<function=NAME>\n``) is appended to the prompt and the engine continues from it.
Those ids were not sampled: they are recorded at the end of the turn's ``context_ids`` (loss mask
0, no logprob) and count as prompt tokens; the segment index sees them as part of the turn's
output, so the next request, whose template renders the call, appends in the same segment. The
reply is parsed from forced text + generated text. Contract: when the model closes a well-formed
call the reply carries it (``finish_reason`` ``tool_calls``); otherwise (``max_tokens`` reached
inside the call, a malformed call, a stop token before ``</tool_call>``) the reply has no
``tool_calls``, its ``content`` is the raw text from the forced opening on, ``finish_reason`` is
``length`` or ``stop``, and the turn records ``tool_call_failures`` with the reason code.

Several choices (chat ``n > 1``): one plan, one engine request per choice (rid ``<rid>-c<i>``;
with a seed, choice ``i`` samples with ``seed + i``), generated concurrently. Choice 0 is recorded
on the plan's route; every other choice is re-planned after it and so lands as a ``branch`` that
forks at choice 0's prompt: its own segment, the same prompt ids, the same thread, trainable
like any segment. Each turn records ``info["choice"] = {"index", "n", "first"}`` (``first``: the
turn index of choice 0), which is how a retry, even after a restart, gets all n replies back.

A resumed session (:mod:`dressage.proxy.replay`): its first live turn records ``info["replay"]``
(outcome and counters) and, when the replay diverged, opens its segment under boundary reason
``replay_diverged`` (which, like ``new_conversation``, lets a new thread take the root thread over).

Top logprobs (``top_logprobs``) are recorded in ``info["top_logprobs"]`` (per generated token a
list of ``[token_id, logprob]``), so a retried request's reply carries them too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from dressage.engines import EngineClient, SamplingParams
from dressage.engines.grammar import GRAMMAR_KINDS as GRAMMAR_PARAMS
from dressage.engines.grammar import THINK_END
from dressage.errors import (
    AuthError,
    ConflictError,
    ContextLengthExceededError,
    DressageError,
    IdempotencyConflictError,
    InvalidRecordError,
    StoreError,
    TurnIndexTakenError,
)
from dressage.proxy.conversation import Conversation
from dressage.proxy.fork_replay import as_recorded
from dressage.proxy.generation import Coordinator, Generation
from dressage.proxy.replay import REASON_REPLAY_DIVERGED
from dressage.proxy.replies import think_open
from dressage.proxy.reply_data import ReplyData
from dressage.proxy.sessions import (
    REASON_CLIENT_DISCONNECTED,
    SegmentState,
    SessionRegistry,
    SessionState,
    context_key,
)
from dressage.redact import redact
from dressage.store import EventStore, NewTurn, Turn, deterministic_key, turn_key
from dressage.tito import IndexedTurn, TitoPlan
from dressage.tito.incremental import PromptIds
from dressage.tito.tool_calls import ParsedAssistant

log = logging.getLogger("dressage.proxy")


@dataclass
class TurnJob:
    """A request between planning and recording."""

    state: SessionState
    conv: Conversation
    plan: TitoPlan
    prompt_ids: Sequence[int]
    generation: Generation
    idem_key: str | None
    context_window: int
    capped: bool
    started: float
    plan_seconds: float
    forced_ids: tuple[int, ...] = ()
    """Ids the proxy wrote at the start of the model's turn (a forced tool-call opening): context."""
    forced_text: str = ""
    dedupe_keys: list[str] = field(default_factory=list)
    choice_index: int = 0
    """Which of the request's ``n`` choices this job generates (0 is recorded first, on the plan's route)."""
    first_turn_index: int | None = None
    """The turn index of choice 0 (set once it is recorded; siblings point at it)."""


def _experts_start(state: SessionState, plan: TitoPlan) -> int:
    """First segment position whose routing this turn must return (see the store's convention)."""
    if plan.route != "append":
        return 0
    seg = state.segments.get(plan.segment_id)
    return max(seg.length - 1, 0) if seg is not None else 0


def prepare_turn(
    state: SessionState,
    conv: Conversation,
    *,
    coordinator: Coordinator,
    client: EngineClient,
    context_window: int,
    record_experts: bool,
    idem_key: str | None,
    started: float,
    default_max_tokens: int,
    plan: TitoPlan | None = None,
) -> TurnJob:
    """Plan the prompt ids and size the generation; raises ContextLengthExceededError when it cannot fit.

    A request that names no cap (and whose run sets none) generates at most ``default_max_tokens``.
    ``plan``: the request's plan when already made (while the session's fence was checked).
    """
    t0 = time.perf_counter()
    if plan is None:
        plan = state.index.plan(conv.messages, conv.tools, conv.enable_thinking)
    forced_text = ""
    forced_ids: tuple[int, ...] = ()
    prompt_ids: Sequence[int] = plan.prompt  # a view: the id list is built only for the engine request
    forcing = _forced_call_grammar(state, conv)
    if conv.force_tool is not None and forcing is None:
        profile = state.index.profile
        forced_text = profile.forced_tool_call_prefix(conv.force_tool, conv.enable_thinking)
        forced_ids = tuple(profile.tokenizer.encode(forced_text))
        prompt_ids = PromptIds(plan.prefix_ids, plan.prefix_len, plan.delta_ids + forced_ids)
    room = context_window - len(prompt_ids)
    if room <= 0:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {context_window} tokens. However, your messages "
            f"resulted in {len(prompt_ids)} tokens. Please reduce the length of the messages."
        )
    cap = default_max_tokens if conv.max_tokens is None else conv.max_tokens
    max_new = min(cap, room)
    capped = cap > room
    sampling = SamplingParams(max_new_tokens=max_new, **conv.sampling)
    if forcing is not None:
        sampling = sampling.model_copy(update=forcing)
    if sampling.sampling_seed is None and state.sampling_seed is not None:
        sampling = sampling.model_copy(update={"sampling_seed": state.sampling_seed})
    gen = Generation(
        coordinator=coordinator,
        client=client,
        prompt_ids=prompt_ids,
        sampling=sampling,
        rid=f"dr-{uuid.uuid4().hex}",
        experts_start=_experts_start(state, plan) if record_experts else None,
        decode=state.index.tokenizer.decode if conv.sampling.get("stop") else None,
        top_logprobs_num=conv.top_logprobs,
        **_reasoning_gate(state, conv, forced=forcing is not None),
    )
    return TurnJob(
        state=state,
        conv=conv,
        plan=plan,
        prompt_ids=prompt_ids,
        generation=gen,
        idem_key=idem_key,
        context_window=context_window,
        capped=capped,
        started=started,
        plan_seconds=time.perf_counter() - t0,
        forced_ids=forced_ids,
        forced_text=forced_text,
    )


class _ReasoningGate(TypedDict, total=False):
    """The reasoning-gate fields of a :class:`Generation` (none when the request has no grammar)."""

    require_reasoning: bool
    think_end_id: int | None


def _forced_call_grammar(state: SessionState, conv: Conversation) -> dict[str, str] | None:
    """A forced tool call with an open thinking block: the profile's grammar as SGLang's ``ebnf``.

    SGLang and vLLM force ``tool_choice`` required / named with a constraint that applies after the
    reasoning (``require_reasoning``): the model thinks first, then must call one of the allowed
    functions (the named one, or any of the tools). ``None`` when no call is forced, the thinking
    is off or the profile has no such grammar: then the forced opening is written into the prompt.
    """
    if conv.force_tool is None or not think_open(state.index.profile, conv):
        return None
    names = [conv.force_tool] if conv.force_tool else [t["function"]["name"] for t in conv.tools or ()]
    grammar = state.index.profile.forced_tool_call_grammar(names)
    return None if grammar is None else {"ebnf": grammar}


def _reasoning_gate(state: SessionState, conv: Conversation, *, forced: bool = False) -> _ReasoningGate:
    """With a grammar and an open thinking block: constrain only the answer (SGLang's ``require_reasoning``).

    ``forced``: the grammar is :func:`_forced_call_grammar`'s (always behind an open thinking block).
    """
    if not forced and not any(conv.sampling.get(k) is not None for k in GRAMMAR_PARAMS):
        return {}
    profile = state.index.profile
    if not think_open(profile, conv):
        return {}
    end = profile.tokenizer.encode(THINK_END)
    return {"require_reasoning": True, "think_end_id": end[0] if len(end) == 1 else None}


def sibling_job(job: TurnJob, index: int) -> TurnJob:
    """The job of choice ``index`` of ``job``'s request: same plan and prompt, its own engine request."""
    gen = job.generation
    sampling = gen.sampling
    if sampling.sampling_seed is not None:
        sampling = sampling.model_copy(update={"sampling_seed": sampling.sampling_seed + index})
    sibling = dataclasses.replace(
        gen,
        sampling=sampling,
        rid=f"{gen.rid}-c{index}",
        ids=[],
        logprobs=[],
        versions=[],
        top=[],
        finish=None,
        experts=None,
        resumes=0,
        engine_seconds=0.0,
        cancelled=False,
    )
    # The sibling forks at choice 0's prompt: its routed experts cover the whole prompt.
    if sibling.experts_start is not None:
        sibling.experts_start = 0
    return dataclasses.replace(job, generation=sibling, choice_index=index, dedupe_keys=[])


async def record_overflow(
    store: EventStore, state: SessionState, stage: str, info: dict[str, object]
) -> None:
    """Append a ``context_overflow`` event (prompt refused, or generation cut by the window)."""
    payload = {"stage": stage, **info}
    try:
        await asyncio.to_thread(
            store.events.append, state.run_name, "context_overflow", payload, session_id=state.session_id
        )
    except DressageError as e:
        log.warning("could not record context_overflow for session %s: %s", state.session_id, e)


@dataclass
class _Placement:
    """Where a turn lands in the log: route, segment, thread and the ids it adds as context.

    Computed without touching the session (:func:`_place`, :func:`_place_abandoned`);
    :func:`_commit` applies it once the turn is durable.
    """

    route: str
    parent_turn_id: str | None
    boundary_reason: str | None
    segment: SegmentState
    """The turn's segment: the session's own for an ``append``, else a new one (not yet in the state)."""
    offset: int
    context: list[int]
    tito: dict[str, object]
    end: int
    """The segment's length once this turn is in it."""
    indexed: IndexedTurn | None = None
    """The TITO index's record of the turn (None for an abandoned turn, kept out of the index)."""
    delta_text: str = ""
    new_segment_key: str | None = None
    """The TITO segment id the new segment is known by in the session (None: append or abandoned)."""
    context_key: str | None = None
    """A ``create``'s conversation key, joined to its thread on commit."""
    bumps_thread: bool = False
    new_segment: bool = True


def _new_thread_index(state: SessionState, job: TurnJob, route: str, parent_segment: str | None) -> int:
    """Thread of a new segment: a branch keeps its parent's; a create joins its conversation's."""
    if route == "branch":
        parent = state.segments.get(parent_segment or "")
        return parent.thread_index if parent is not None else 0
    return state.thread_by_context.get(context_key(job.conv.messages), state.next_thread)


def _place(state: SessionState, job: TurnJob, turn_id: str) -> _Placement:
    """Resolve the plan against the index and derive segment/thread fields (changes nothing)."""
    plan = job.plan
    rec, delta_text = state.index.resolve(plan, turn_id, [*job.forced_ids, *job.generation.ids])
    tito: dict[str, object] = {
        "lineage": rec.segment_id,
        "fork_at": rec.fork_at,
        "delta_start": 0,
        "tools_key": rec.tools_key,
        "header_len": rec.header_len,
    }
    if job.forced_ids:
        tito["forced"] = len(job.forced_ids)
    key: str | None = None
    if rec.route == "append":
        seg = state.segments[rec.segment_id]
        context = [*plan.delta_ids, *job.forced_ids]
        new_segment_key = None
    else:
        thread = _new_thread_index(state, job, rec.route, plan.parent_segment_id)
        if rec.route == "create":
            key = context_key(job.conv.messages)
            tito["context_key"] = key
        seg = SegmentState(state.next_segment, thread, 0)
        new_segment_key = rec.segment_id
        context = list(job.prompt_ids)
        tito["delta_start"] = len(context) - len(job.forced_ids) - len(rec.delta_ids)
    offset = seg.length
    end = offset + len(context) + len(job.generation.ids)
    return _Placement(
        rec.route,
        rec.parent_turn_id,
        rec.boundary_reason,
        seg,
        offset,
        context,
        tito,
        end,
        indexed=rec,
        delta_text=delta_text,
        new_segment_key=new_segment_key,
        context_key=key,
        bumps_thread=rec.route != "append",
        new_segment=rec.route != "append",
    )


def _place_abandoned(state: SessionState, job: TurnJob) -> _Placement:
    """A turn the client abandoned: a dead-end segment of its own, outside the segment index.

    The retry the client may send renders the same prompt; it must continue the segment as if the
    aborted turn had not happened (one segment), so the aborted turn is kept out of the TITO index
    and out of retry dedupe, and recorded as a side segment (route ``branch`` from the turn it
    would have extended, or ``create``) with ``boundary_reason`` ``client_disconnected``.
    """
    plan = job.plan
    route = "create" if plan.route == "create" else "branch"
    thread = _new_thread_index(state, job, route, plan.parent_segment_id)
    seg = SegmentState(state.next_segment, thread, 0)
    parent = plan.parent_turn_id if route == "branch" else None
    tito: dict[str, object] = {"aborted": True}
    if job.forced_ids:
        tito["forced"] = len(job.forced_ids)
    context = list(job.prompt_ids)
    end = len(context) + len(job.generation.ids)
    return _Placement(route, parent, REASON_CLIENT_DISCONNECTED, seg, 0, context, tito, end)


def _commit(state: SessionState, f: _Placement, turn_index: int, ends_replay: bool) -> None:
    """Apply a durable turn's placement to the session (index, segments, threads, counters)."""
    if f.indexed is not None:
        state.index.apply(f.indexed, delta_text=f.delta_text)
    if f.new_segment:
        state.next_segment += 1
        if f.new_segment_key is not None:
            state.segments[f.new_segment_key] = f.segment
    if f.context_key is not None:
        state.thread_by_context.setdefault(f.context_key, f.segment.thread_index)
    if f.bumps_thread:
        state.next_thread = max(state.next_thread, f.segment.thread_index + 1)
    f.segment.length = f.end
    state.next_turn = turn_index + 1
    if ends_replay and state.replay is not None:
        state.replay.end(f.route, turn_index)


def _parse_safely(
    parse: Callable[[str], ParsedAssistant] | None, turn_id: str
) -> tuple[ParsedAssistant | None, Exception | None]:
    """The reply's parse, or the exception it raised: a parser bug must not lose generated tokens."""
    if parse is None:
        return None, None
    try:
        return parse(turn_id), None
    except Exception as e:  # a bug in a parser: the turn is still recorded, then the error is raised
        log.error("parsing the reply of turn %s failed; recording it anyway", turn_id, exc_info=True)
        return None, e


@dataclass(frozen=True)
class _Stop:
    """How the generation stopped: the reply's ``finish_reason``, the stop string, the window."""

    reason: str
    matched: str | None
    hit_window: bool


def _stop(job: TurnJob) -> _Stop:
    gen = job.generation
    assert gen.finish is not None
    matched = gen.finish.matched if isinstance(gen.finish.matched, str) else None
    reason = {"length": "length", "abort": "abort"}.get(gen.finish.type, "stop")
    hit_window = (
        reason == "length" and job.capped and len(job.prompt_ids) + len(gen.ids) >= job.context_window
    )
    return _Stop(reason, matched, hit_window)


def _replay_end(
    state: SessionState, job: TurnJob, f: _Placement, abandoned: bool
) -> dict[str, object] | None:
    """The replay summary this turn records when it is a resumed session's first live turn (its
    boundary becomes ``replay_diverged`` when the replay diverged); the session is not changed."""
    replay = state.replay
    if replay is None or not replay.ending or abandoned or job.choice_index:
        return None
    ended = dataclasses.replace(replay)
    if ended.end(f.route, state.next_turn) == "diverged":
        f.boundary_reason = REASON_REPLAY_DIVERGED
    return ended.summary()


def _turn_info(
    job: TurnJob,
    f: _Placement,
    stop: _Stop,
    turn_index: int,
    extra: dict[str, object],
    parsed: ParsedAssistant | None,
    secrets: tuple[str, ...],
    created: int,
) -> dict[str, object]:
    """The turn's ``info``: TITO placement, engine request, dialect, and what happened on the way."""
    gen, conv = job.generation, job.conv
    info: dict[str, object] = {
        "tito": f.tito,
        "created": created,
        "engine_rid": gen.rid,
        "dialect": conv.dialect,
        **conv.info,
    }
    flags: dict[str, object] = {
        "matched_stop": stop.matched,
        "idempotency_key": job.idem_key,
        "ignored_params": conv.ignored,
        "resumes": gen.resumes,
        "context_capped": stop.hit_window,
        "forced_tool_call": (conv.force_tool or "any") if conv.force_tool is not None else None,
    }
    info.update({k: v for k, v in flags.items() if v})
    info.update(extra)
    if conv.n > 1:
        first = turn_index if job.choice_index == 0 else job.first_turn_index
        info["choice"] = {"index": job.choice_index, "n": conv.n, "first": first}
    if conv.top_logprobs:
        info["top_logprobs"] = [[[t, lp] for t, lp in row] for row in gen.top]
    if parsed is not None and parsed.failures:
        info["tool_call_failures"] = [
            {"reason": x.reason, "text": redact(x.text[:2000], secrets)} for x in parsed.failures
        ]
    return info


def _store_record(
    job: TurnJob, f: _Placement, stop: _Stop, turn_index: int, turn_id: str, info: dict[str, object]
) -> NewTurn:
    """The log's turn: ids, logprobs, versions, placement and the turn's info.

    A turn the client abandoned (``tito.aborted``) is recorded with loss mask 0 on every generated
    token: it is a cut-off answer the client never saw (its retry is the one trained), so the
    trainer reports its tokens as ``recorded_untrained`` (docs/training.md).
    """
    gen, state = job.generation, job.state
    experts = gen.experts
    expected = len(f.context) + len(gen.ids) - (1 if f.offset == 0 else 0)
    if experts is not None and experts.shape[0] != expected:
        info["experts_dropped"] = f"engine returned {experts.shape[0]} rows, expected {expected}"
        experts = None
    return NewTurn(
        session_id=state.session_id,
        turn_index=turn_index,
        context_ids=f.context,
        generated_ids=gen.ids,
        logprobs=gen.logprobs,
        policy_versions=gen.versions,
        loss_mask=[False] * len(gen.ids) if f.tito.get("aborted") else None,
        thread_index=f.segment.thread_index,
        parent_turn_id=f.parent_turn_id,
        route=f.route,
        segment_index=f.segment.index,
        segment_offset=f.offset,
        boundary_reason=f.boundary_reason,
        routed_experts=experts,
        finish_reason=stop.reason,
        sampling_params={**gen.sampling.to_body(), "model": job.conv.model},
        request_fingerprint=job.conv.fingerprint,
        latency_ms=(time.perf_counter() - job.started) * 1000.0,
        info=info,
        key=turn_id,
    )


async def _append(store: EventStore, registry: SessionRegistry, state: SessionState, record: NewTurn) -> None:
    """Append the turn durably; a refusal leaves the session's state as it was.

    A turn index another proxy took means the log moved on without us: the cached state is
    evicted (the next request rebuilds it from the log). A session that ended meanwhile answers
    as a finalized session does; an ambiguous store failure evicts too (the log is the truth).
    """
    try:
        await store.turns.append_async(state.run_name, record)
    except (TurnIndexTakenError, IdempotencyConflictError) as e:
        # Another proxy recorded this turn index first (two proxies raced on one session).
        registry.evict(state.session_id)
        raise ConflictError(
            f"turn {record.turn_index} of session {state.session_id} was recorded concurrently by another "
            "request (another proxy serving the same session); nothing was recorded for this one. "
            "Retry it: it is answered from the log if it is the same request",
            code="turn_conflict",
        ) from e
    except InvalidRecordError as e:
        session = await asyncio.to_thread(store.sessions.get, state.session_id)
        if session.status != "running":
            raise AuthError(f"session {state.session_id} is {session.status}; nothing was recorded") from e
        raise
    except StoreError:
        registry.evict(state.session_id)
        raise


def _reply(
    job: TurnJob,
    f: _Placement,
    stop: _Stop,
    turn_index: int,
    turn_id: str,
    created: int,
    parsed: ParsedAssistant | None,
) -> ReplyData:
    """What the dialect answers from (and what a retry of the same request is answered from)."""
    gen = job.generation
    return ReplyData(
        turn_index=turn_index,
        turn_id=turn_id,
        generated_ids=list(gen.ids),
        logprobs=list(gen.logprobs),
        stop_reason=stop.reason,
        matched_stop=stop.matched,
        prompt_tokens=f.offset + len(f.context),
        created=created,
        rid=gen.rid,
        forced_ids=list(job.forced_ids),
        parsed=parsed,
        parsed_for=job.conv.fingerprint,
        top_logprobs=[list(row) for row in gen.top] if job.conv.top_logprobs else None,
        choice_index=job.choice_index,
    )


async def record_turn(
    store: EventStore,
    registry: SessionRegistry,
    job: TurnJob,
    parse: Callable[[str], ParsedAssistant] | None,
    secrets: tuple[str, ...],
    *,
    abandoned: bool = False,
) -> ReplyData:
    """Append the turn durably, then index it for dedupe; returns the reply data.

    ``parse(turn_id)`` parses the reply (its tool-call failures are recorded on the turn).
    ``abandoned``: the client went away before the reply ended; the turn (partial: ``finish_reason``
    ``abort``) is recorded as a dead-end segment (see :func:`_place_abandoned`) and is never a
    retry's reply. The session's state changes only once the append succeeded.
    """
    state = job.state
    stop = _stop(job)
    async with state.lock:
        if state.finished:
            raise AuthError(
                f"session {state.session_id} was finalized during generation; nothing was recorded"
            )
        if job.choice_index and not abandoned:
            # A sibling choice: planned now, after choice 0 is indexed, it forks at choice 0's prompt.
            job.plan = state.index.plan(job.conv.messages, job.conv.tools, job.conv.enable_thinking)
        turn_index = state.next_turn
        turn_id = turn_key(state.run_name, state.session_id, turn_index)
        f = _place_abandoned(state, job) if abandoned else _place(state, job, turn_id)
        replay_info = _replay_end(state, job, f, abandoned)
        parsed, parse_error = _parse_safely(parse, turn_id)
        extra: dict[str, object] = {"client_disconnected": True} if abandoned else {}
        if replay_info is not None:
            extra["replay"] = replay_info
        if parse_error is not None:
            extra["reply_parse_error"] = redact(f"{type(parse_error).__name__}: {parse_error}", secrets)
        created = int(time.time())
        info = _turn_info(job, f, stop, turn_index, extra, parsed, secrets, created)
        await _append(store, registry, state, _store_record(job, f, stop, turn_index, turn_id, info))
        _commit(state, f, turn_index, ends_replay=replay_info is not None)
        reply = _reply(job, f, stop, turn_index, turn_id, created, parsed)
        if not abandoned and job.choice_index:
            state.remember_sibling(reply, job.first_turn_index)
        elif not abandoned:
            extends = f.parent_turn_id if f.tito.get("fork_at") == "end" else None
            state.remember(reply, job.conv.fingerprint, job.idem_key, extends)
            state.link_response(turn_index, info)
    if parse_error is not None:
        raise parse_error  # recorded first: the tokens are in the log, the client gets our 500
    if stop.hit_window:
        await record_overflow(
            store,
            state,
            "generation",
            {"turn_id": turn_id, "prompt_tokens": len(job.prompt_ids), "context_window": job.context_window},
        )
    return reply


async def copy_from_parent(
    store: EventStore, registry: SessionRegistry, state: SessionState, conv: Conversation
) -> ReplyData | None:
    """A fork's request before its fork turn: copy the parent's matching turns into the fork.

    Returns the parent's recorded reply (now the fork's own turn) for ``conv``; None when only
    dead-end turns remained to copy (the request is the first live one). A request that matches
    no recorded turn records a ``fork_diverged`` event and raises :class:`ConflictError` (409):
    see :mod:`dressage.proxy.fork_replay`.
    """
    fork = state.fork
    async with state.lock:
        if fork is None or not fork.pending(state.next_turn):
            return None
        try:
            parent_turns = fork.match(state.index, conv, state.next_turn)
        except ConflictError as e:
            payload = {"turn_index": state.next_turn, "fork_turn": fork.fork_turn, "error": str(e)}
            key = deterministic_key(state.run_name, state.session_id, "fork_diverged", state.next_turn)
            await asyncio.to_thread(
                store.events.append,
                state.run_name,
                "fork_diverged",
                payload,
                key=key,
                session_id=state.session_id,
            )
            raise
        for parent_turn in parent_turns:
            record = fork.copy(parent_turn, state.run_name, state.session_id, conv.fingerprint)
            await _append(store, registry, state, record)
            state.apply_turn(as_recorded(record, parent_turn))
        answered = next((t for t in reversed(parent_turns) if _is_target(t)), None)
    return state.replies.get(answered.turn_index) if answered is not None else None


def _is_target(turn: Turn) -> bool:
    """Whether a recorded turn answers a request (choice 0, not a dead end)."""
    tito = turn.info.get("tito") or {}
    choice = turn.info.get("choice") or {}
    return not tito.get("aborted") and not int(choice.get("index", 0))
