"""Per-session proxy state, a cache of the log.

A :class:`SessionState` holds what routing a request needs: the session's TITO
:class:`~dressage.tito.SegmentIndex`, the mapping from TITO segment ids to the log's segments and
threads, the next turn index, and the replies of recorded turns for retry dedupe. All of it is
derivable from the session's recorded turns (each turn's ``info["tito"]`` keeps what the index
needs), so :class:`SessionRegistry` rebuilds a state from the log whenever a token is not cached:
after a proxy restart the agent's retried request continues the same session. Several proxies can
serve one session from one log: each request first checks the session's status and recorded turn
count (:meth:`~dressage.store.EventStore.sessions.head`), and a cache that is behind the log (another
proxy recorded a turn) is rebuilt before the request is generated. That check (the session's
fence) is started as the request arrives and runs while its body is read, parsed and planned
(:meth:`SessionRegistry.begin`, :meth:`SessionRegistry.confirm`): its database round trip is off the
turn's path, and a stale cache is still caught before any engine call. A session this proxy opened
itself starts cached (:meth:`SessionRegistry.adopt`): its first turn skips the rebuild.

Segments and threads: a segment is one token-contiguous chain (the TITO index's unit, keyed by
its segment id; the log's ``segment_index``). The log's ``thread_index`` names an agent context:
``0`` for the session's first one (the root, whose last segment is the anchor). A ``branch``
keeps its parent's thread; a ``create`` joins the thread of the same conversation (:func:`context_key`: same system prompt and same first
message after it) and otherwise opens a new one (a subagent, even one with the main agent's system
prompt and tools).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from dressage.errors import AuthError, ConflictError
from dressage.proxy.checkpoint_start import CheckpointStart, build_checkpoint_start
from dressage.proxy.fork_replay import ForkReplay, build_fork_replay
from dressage.proxy.replay import Replay, build_replay
from dressage.proxy.reply_data import ReplyData
from dressage.store import EventStore, Session, Turn
from dressage.tito import IndexedTurn, SegmentIndex
from dressage.tito.profiles import ModelProfile, check_run_profile

log = logging.getLogger("dressage.proxy")


REASON_CLIENT_DISCONNECTED = "client_disconnected"
"""Boundary reason of the dead-end segment holding a turn whose client went away mid-generation."""


def _text(content: object) -> str:
    if isinstance(content, list):
        content = "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return str(content or "").strip()


def context_key(messages: list[dict[str, object]]) -> str:
    """Short hash of a conversation's identity: the system prompt and the first message after it.

    Requests with the same key belong to one agent context (thread) even when their tokens
    do not extend each other (a new user turn after thinking, a changed tools list, a compaction
    that keeps the task); a request that shares only the system prompt does not (a subagent).
    """
    first = messages[0] if messages else {}
    system = _text(first.get("content")) if first.get("role") in ("system", "developer") else None
    rest = messages[1:] if system is not None else messages
    head = rest[0] if rest else {}
    ident = [system, head.get("role"), _text(head.get("content"))]
    return hashlib.sha256(json.dumps(ident, ensure_ascii=False).encode()).hexdigest()[:16]


@dataclass
class SegmentState:
    """One log segment (= one TITO segment): its index, thread and token count so far."""

    index: int
    thread_index: int
    length: int


def response_id(rid: str) -> str:
    """The Responses-API id of a turn: from its engine request id (recorded, so a restarted proxy knows it)."""
    return "resp_" + rid.removeprefix("dr-")


@dataclass(frozen=True)
class ResponseLink:
    """A stored response: the one before it, the messages its request added, how its reply parses."""

    turn_index: int
    previous: str | None
    input: list[dict[str, object]]
    parse_tools: bool
    enable_thinking: bool | None


@dataclass
class SessionState:
    """The cached state of one live session."""

    session: Session
    run_name: str
    index: SegmentIndex
    segments: dict[str, SegmentState] = field(default_factory=dict)
    thread_by_context: dict[str, int] = field(default_factory=dict)
    next_thread: int = 0
    next_turn: int = 0
    next_segment: int = 0
    finished: bool = False
    replies: dict[int, ReplyData] = field(default_factory=dict)
    by_fingerprint: dict[str, int] = field(default_factory=dict)
    by_idem_key: dict[str, int] = field(default_factory=dict)
    idem_fingerprints: dict[str, str] = field(default_factory=dict)
    """The body each ``Idempotency-Key`` answers (in flight or recorded); another body gets 409.
    A request that ended without a reply (its client left, the engine failed) frees its key."""
    inflight: dict[str, asyncio.Future[ReplyData]] = field(default_factory=dict)
    turn_fingerprint: dict[str, str] = field(default_factory=dict)
    responses: dict[str, ResponseLink] = field(default_factory=dict)
    """Stored Responses-API replies by response id (``previous_response_id`` continues them)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    replay: Replay | None = None
    """A resumed session's replay of its recorded turns (see :mod:`dressage.proxy.replay`)."""
    fork: ForkReplay | None = None
    """A fork's copy of its parent's first turns, while some remain (see :mod:`dressage.proxy.fork_replay`)."""
    checkpoint_start: CheckpointStart | None = None
    """A session started from a checkpoint, until its first live request is checked
    (:mod:`dressage.proxy.checkpoint_start`)."""

    @property
    def sampling_seed(self) -> int | None:
        """The seed of requests that name none: the session's ``info["sampling_seed"]`` (a fork's
        branch seed, so a CLI agent, which sends no seed, samples each branch differently)."""
        seed = self.session.info.get("sampling_seed") if isinstance(self.session.info, dict) else None
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.session.id

    def lookup(self, fingerprint: str, idem_key: str | None) -> ReplyData | asyncio.Future[ReplyData] | None:
        """A recorded reply (or the future of an in-flight one) for a retried request, else None.

        An ``Idempotency-Key`` matches any turn of the session; a bare fingerprint (sha256 of the
        body) only matches a turn that nothing has extended yet, so deliberately re-sending an old
        request after the conversation moved on generates again (a branch). A key re-used with a
        different body raises :class:`ConflictError` (409): it never answers with another reply.
        """
        if idem_key:
            first = self.idem_fingerprints.get(idem_key, fingerprint)
            if first != fingerprint:
                raise ConflictError(
                    f"Idempotency-Key {idem_key!r} was already used for a different request body; "
                    "use a new key for a new request",
                    param="Idempotency-Key",
                    code="idempotency_key_reused",
                )
        keys = [f"idem:{idem_key}"] if idem_key else []
        keys.append(f"fp:{fingerprint}")
        for key in keys:
            if key in self.inflight:
                return self.inflight[key]
        if idem_key and (i := self.by_idem_key.get(idem_key)) is not None:
            return self.replies.get(i)
        if (i := self.by_fingerprint.get(fingerprint)) is not None:
            return self.replies.get(i)
        return None

    def remember(
        self, reply: ReplyData, fingerprint: str | None, idem_key: str | None, parent: str | None
    ) -> None:
        """Index a recorded turn for dedupe; a turn it ``parent`` extends stops being a dedupe target."""
        self.replies[reply.turn_index] = reply
        if parent is not None:
            old = self.turn_fingerprint.pop(parent, None)
            if old is not None and self.by_fingerprint.get(old) is not None:
                parent_idx = self.by_fingerprint[old]
                if self.replies.get(parent_idx) is not None and self.replies[parent_idx].turn_id == parent:
                    del self.by_fingerprint[old]
        if fingerprint:
            self.by_fingerprint[fingerprint] = reply.turn_index
            self.turn_fingerprint[reply.turn_id] = fingerprint
        if idem_key:
            self.by_idem_key[idem_key] = reply.turn_index
            if fingerprint:
                self.idem_fingerprints.setdefault(idem_key, fingerprint)

    def remember_sibling(self, reply: ReplyData, first_turn_index: int | None) -> None:
        """Index choice ``i > 0`` of an ``n > 1`` request under its choice 0 (a retry replays all)."""
        self.replies[reply.turn_index] = reply
        first = self.replies.get(first_turn_index) if first_turn_index is not None else None
        if first is not None:
            first.siblings = sorted([*first.siblings, reply], key=lambda r: r.choice_index)

    def link_response(self, turn_index: int, info: Mapping[str, object]) -> None:
        """Index a turn recorded through the Responses API with ``store`` (its ``info["responses"]``)."""
        link, rid = info.get("responses"), info.get("engine_rid")
        if isinstance(link, dict) and isinstance(rid, str) and rid:
            self.responses[response_id(rid)] = ResponseLink(turn_index=turn_index, **link)

    def apply_turn(self, turn: Turn) -> None:
        """Fold one recorded turn into the state (used when rebuilding from the log)."""
        tito = turn.info.get("tito") or {}
        n_ctx, n_gen = int(turn.context_ids.size), int(turn.generated_ids.size)
        self.next_turn = max(self.next_turn, turn.turn_index + 1)
        self.next_segment = max(self.next_segment, turn.segment_index + 1)
        if tito.get("aborted"):
            return  # a dead-end turn the client abandoned: not in the index, never a retry's reply
        n_forced = int(tito.get("forced", 0))
        ctx = [int(x) for x in turn.context_ids]
        forced = ctx[n_ctx - n_forced :] if n_forced else []
        if tito.get("lineage"):
            rec = IndexedTurn(
                turn_id=turn.id,
                segment_id=tito["lineage"],
                route=turn.route,  # type: ignore[arg-type]
                parent_segment_id=None,
                parent_turn_id=turn.parent_turn_id,
                fork_at=tito.get("fork_at"),
                delta_ids=tuple(ctx[int(tito.get("delta_start", 0)) : n_ctx - n_forced]),
                generated_ids=(*forced, *(int(x) for x in turn.generated_ids)),
                tools_key=tito.get("tools_key", ""),
                header_len=int(tito.get("header_len", 0)),
                boundary_reason=turn.boundary_reason,
            )
            self.index.apply(rec)
            self.segments[rec.segment_id] = SegmentState(
                turn.segment_index, turn.thread_index, turn.segment_offset + n_ctx + n_gen
            )
            key = tito.get("context_key") or tito.get("system_key")  # system_key: older records
            if turn.route == "create" and key is not None:
                self.thread_by_context.setdefault(key, turn.thread_index)
            self.next_thread = max(self.next_thread, turn.thread_index + 1)
        reply = ReplyData(
            turn_index=turn.turn_index,
            turn_id=turn.id,
            generated_ids=[int(x) for x in turn.generated_ids],
            logprobs=[float(x) for x in turn.logprobs],
            stop_reason=turn.finish_reason or "stop",
            matched_stop=turn.info.get("matched_stop"),
            prompt_tokens=turn.segment_offset + n_ctx,
            created=int(turn.info.get("created", 0)),
            rid=str(turn.info.get("engine_rid", turn.id)),
            forced_ids=forced,
        )
        top = turn.info.get("top_logprobs")
        if isinstance(top, list):
            reply.top_logprobs = [[(int(t), float(lp)) for t, lp in row] for row in top]
        choice = turn.info.get("choice") or {}
        reply.choice_index = int(choice.get("index", 0))
        if reply.choice_index:
            self.remember_sibling(reply, choice.get("first"))
            return
        extends = turn.parent_turn_id if tito.get("fork_at") == "end" else None
        self.remember(reply, turn.request_fingerprint, turn.info.get("idempotency_key"), extends)
        self.link_response(turn.turn_index, turn.info)


def _retrieve(fence: asyncio.Future[bool]) -> None:
    """Mark a fence's error retrieved (a request that failed first never awaits its fence)."""
    if not fence.cancelled():
        fence.exception()


def token_digest(token: str) -> str:
    """sha256 of a bearer token (the cache key; tokens themselves are never kept)."""
    return hashlib.sha256(token.encode()).hexdigest()


class SessionRegistry:
    """Bearer token -> :class:`SessionState`, loading (and rebuilding) from the log on a miss."""

    def __init__(self, store: EventStore, profile: ModelProfile) -> None:
        self.store = store
        self.profile = profile
        self._by_digest: dict[str, SessionState] = {}
        self._by_id: dict[str, str] = {}
        self._loading: dict[str, asyncio.Future[SessionState | None]] = {}

    def _build(self, token: str) -> SessionState | None:
        """Look the token up and replay the session's turns (runs in a worker thread)."""
        session = self.store.sessions.by_token(token)
        if session is None or session.status != "running":
            return None
        run = self.store.runs.by_id(session.run_id)
        check_run_profile(run.name, run.config, self.profile)
        state = SessionState(session=session, run_name=run.name, index=SegmentIndex(self.profile))
        turns = self.store.turns.read(session_id=session.id, with_experts=False)
        for turn in turns:
            state.apply_turn(turn)
        state.replay = build_replay(session, turns)
        state.checkpoint_start = build_checkpoint_start(session, turns)
        if session.parent_session_id is not None and len(turns) < (session.fork_turn or 0):
            parent = self.store.turns.read(session_id=session.parent_session_id, with_experts=True)
            state.fork = build_fork_replay(session, turns, parent)
        if turns:
            log.info("rebuilt session %s from %d recorded turns", session.id, len(turns))
        return state

    def adopt(self, token: str, session: Session, run_name: str) -> SessionState:
        """Cache the state of a session just opened here (no turns yet, not a fork: a fork's state
        holds its parent's turns and is built from the log): its first request does not rebuild it
        (the fence still checks it, as every request's)."""
        state = SessionState(session=session, run_name=run_name, index=SegmentIndex(self.profile))
        state.checkpoint_start = build_checkpoint_start(session, [])
        digest = token_digest(token)
        state = self._by_digest.setdefault(digest, state)
        self._by_id[state.session_id] = digest
        return state

    async def begin(self, token: str | None) -> tuple[SessionState, asyncio.Future[bool] | None]:
        """The cached state of ``token`` and its fence, started (awaited by :meth:`confirm`); an
        uncached token is authenticated (rebuilt) at once and has no fence."""
        if token:
            digest = token_digest(token)
            state = self._by_digest.get(digest)
            if state is not None and not state.finished:
                fence = asyncio.ensure_future(self._current(digest, state))
                fence.add_done_callback(_retrieve)
                return state, fence
        return await self.authenticate(token), None

    async def confirm(
        self, token: str | None, state: SessionState, fence: asyncio.Future[bool] | None
    ) -> SessionState:
        """``state`` when its fence passed, else the state rebuilt from the log (401 as
        :meth:`authenticate`: a finished session, a token of an earlier attempt)."""
        if fence is None or await fence:
            if state.finished:
                raise AuthError("unknown or finished session token; open a session with the admin API")
            return state
        return await self.authenticate(token)

    async def authenticate(self, token: str | None) -> SessionState:
        """The live session bound to ``token``; raises :class:`AuthError` (401) otherwise."""
        if not token:
            raise AuthError(
                "no session token: send 'Authorization: Bearer <token>' or use the base URL /s/<token>/v1"
            )
        digest = token_digest(token)
        state = self._by_digest.get(digest)
        if state is not None and not state.finished and not await self._current(digest, state):
            state = None
        if state is None:
            pending = self._loading.get(digest)
            if pending is None:
                pending = asyncio.get_running_loop().create_future()
                self._loading[digest] = pending
                try:
                    pending.set_result(await asyncio.to_thread(self._build, token))
                except Exception as e:
                    pending.set_exception(e)
                    pending.exception()  # mark retrieved: the raise below reports it
                    raise
                except asyncio.CancelledError:
                    pending.cancel()
                    raise
                finally:
                    self._loading.pop(digest, None)
            state = await asyncio.shield(pending)
            if state is not None:
                state = self._by_digest.setdefault(digest, state)
                self._by_id[state.session_id] = digest
        if state is None or state.finished:
            raise AuthError("unknown or finished session token; open a session with the admin API")
        return state

    async def _current(self, digest: str, state: SessionState) -> bool:
        """Whether a cached state still describes the log (False: it was evicted, rebuild it).

        Several proxies may serve one session (any proxy serves any session): another one may have
        recorded turns since this cache was built, or finalized the session. One indexed read per
        request tells; a log *behind* the cache only means this proxy's own appends are in flight.
        """
        head = await self.store.sessions.head_async(state.session_id)
        if head.status != "running":
            self.finish(state.session_id)
            raise AuthError(f"session {state.session_id} is {head.status}; its token no longer works")
        if head.attempt != state.session.attempt:
            log.info(
                "session %s was taken over by attempt %d: dropping the cached state",
                state.session_id,
                head.attempt,
            )
            self.evict(state.session_id)
            return False  # the rebuild looks the token up again: an earlier attempt's token is refused
        recorded = head.turns
        if recorded <= state.next_turn:
            return True
        log.info(
            "session %s has %d turns in the log, %d in this proxy's cache (another proxy served it): rebuilding",
            state.session_id,
            recorded,
            state.next_turn,
        )
        if self._by_digest.get(digest) is state:
            self.evict(state.session_id)
        return False

    def evict(self, session_id: str) -> None:
        """Forget a session's cached state (the next request rebuilds it from the log)."""
        digest = self._by_id.pop(session_id, None)
        if digest is not None:
            self._by_digest.pop(digest, None)

    def finish(self, session_id: str) -> None:
        """Mark a session finished: its token is refused from now on."""
        digest = self._by_id.get(session_id)
        if digest is not None and digest in self._by_digest:
            self._by_digest[digest].finished = True
        self.evict(session_id)

    def cached(self, session_id: str) -> SessionState | None:
        """The cached state of session ``session_id``, if this proxy holds it."""
        digest = self._by_id.get(session_id)
        return self._by_digest.get(digest) if digest is not None else None

    def live_count(self) -> int:
        """Number of cached live sessions (finished ones are evicted)."""
        return len(self._by_digest)

    def live_sessions(self) -> list[SessionState]:
        """Every cached live session."""
        return [s for s in self._by_digest.values() if not s.finished]
