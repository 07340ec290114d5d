"""The proxy's shared state and the operations behind both the Python and the HTTP admin API.

:class:`ProxyService` wires the store, the engine pool, the pause/resume coordinator, the session
registry, the metrics and admission control; the route modules and :class:`~dressage.proxy.server.ProxyServer` only
call it. Store calls are synchronous and run in worker threads so the event loop keeps streaming.
"""

from __future__ import annotations

import asyncio
import logging
import secrets as pysecrets
from collections.abc import Mapping
from typing import Any, Unpack

from dressage.config import Settings
from dressage.engines import EnginePool
from dressage.errors import ConflictError, DressageError, EngineError, RequestError, UnknownSessionError
from dressage.proxy.admission import AdmissionGate
from dressage.proxy.contract import (
    FinalizedSession,
    Proxy,
    SessionHandle,
    TurnBoundaryHook,
    TurnRequest,
    WatchesTurns,
)
from dressage.proxy.generation import Coordinator
from dressage.proxy.metrics import ProxyMetrics
from dressage.proxy.sessions import SessionRegistry
from dressage.store import EventStore, Run
from dressage.store.records import SessionOpening, SessionOutcome
from dressage.tito import get_profile
from dressage.tito.profiles import RUN_RECORD_KEY, ModelProfile, check_run_profile, profile_record

log = logging.getLogger("dressage.proxy")
TOKEN_PREFIX = "sk-dressage-"
"""Session tokens look like API keys (``sk-...``) so log redaction recognises them."""


class ProxyService:
    """Everything a proxy instance shares between requests; implements :class:`~dressage.proxy.contract.Proxy`
    in-process (:class:`~dressage.proxy.server.ProxyServer` adds listening)."""

    def __init__(
        self,
        store: EventStore,
        engine_urls: list[str],
        *,
        settings: Settings,
        profile: str | ModelProfile = "qwen3.5",
        record_experts: bool = False,
        context_window: int | None = None,
        default_sampling: Mapping[str, object] | None = None,
        engine_timeout: float = 600.0,
    ) -> None:
        self.store = store
        self.settings = settings
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.pool = EnginePool(
            engine_urls, timeout=engine_timeout, connect_timeout=settings.engine_connect_timeout_s
        )
        self.coordinator = Coordinator(self.pool)
        self.registry = SessionRegistry(store, self.profile)
        self.metrics = ProxyMetrics()
        self.admission = AdmissionGate(
            settings.proxy_max_active,
            settings.proxy_max_queue,
            settings.proxy_queue_timeout_s,
            settings.proxy_retry_after_s,
            self.metrics,
        )
        self.record_experts = record_experts
        self.default_sampling = dict(default_sampling or {})
        self.secrets: tuple[str, ...] = (
            tuple(s.get_secret_value() for s in settings.secrets) + store.db.secrets
        )
        admin = settings.admin_token.get_secret_value() if settings.admin_token else None
        if admin:
            self.secrets += (admin,)
        self.admin_token = admin
        self.model_name = self.profile.name
        self._base_url = ""
        self._context_window = context_window
        self._window_lock = asyncio.Lock()
        self._turn_hooks: dict[str, TurnBoundaryHook] = {}

    async def aclose(self) -> None:
        """Close engine connections and this loop's store connections."""
        await self.pool.aclose()
        await self.store.turns.aclose_async()

    async def context_window(self) -> int:
        """The context window: configured, else the engine's ``max_context``, else the profile's."""
        if self._context_window is not None:
            return self._context_window
        async with self._window_lock:
            if self._context_window is None:
                window = self.profile.context_window
                try:
                    info = await self.pool.clients[0].model_info()
                    reported = getattr(info, "max_context", None)
                    if isinstance(reported, int) and reported > 0:
                        window = min(window, reported)
                except EngineError as e:
                    log.warning("could not read the engine's context length (%s); using %d", e, window)
                    return window
                self._context_window = window
        return self._context_window

    @property
    def base_url(self) -> str:
        """The root URL agents reach this proxy at (set by whoever serves it; empty in-process)."""
        return self._base_url

    def session_url(self, token: str) -> str:
        """The OpenAI base URL that carries ``token``."""
        return f"{self._base_url}/s/{token}/v1"

    # --- turn boundaries (in-process owners only: see contract.WatchesTurns) ----------------------

    def watch_turns(self, session_id: str, hook: TurnBoundaryHook) -> None:
        """Call ``hook(K)`` when live request K of ``session_id`` arrives (see :class:`WatchesTurns`)."""
        self._turn_hooks[session_id] = hook

    def unwatch_turns(self, session_id: str) -> None:
        """Stop calling the session's turn hook."""
        self._turn_hooks.pop(session_id, None)

    def watched(self, session_id: str) -> bool:
        """Whether a turn hook watches ``session_id``."""
        return session_id in self._turn_hooks

    def turn_boundary(self, session_id: str, request: TurnRequest) -> asyncio.Future[None] | None:
        """Start the session's turn hook for ``request`` (None: nobody watches); the caller awaits it
        before the reply leaves."""
        hook = self._turn_hooks.get(session_id)
        if hook is None:
            return None
        return asyncio.ensure_future(_run_hook(hook, session_id, request))

    # --- admin operations -------------------------------------------------------------------------

    async def create_run(self, name: str, config: Mapping[str, object] | None = None) -> Run:
        """Create run ``name`` (or get it when it exists with the same config); the config records
        this proxy's model profile, and an existing run recorded with another one is refused."""
        return await asyncio.to_thread(self._create_run, name, dict(config or {}))

    def _create_run(self, name: str, config: dict[str, object]) -> Run:
        if name in {r.name for r in self.store.runs.list()}:
            check_run_profile(name, self.store.runs.get(name).config, self.profile)
        return self.store.runs.create(name, {**config, RUN_RECORD_KEY: profile_record(self.profile)})

    async def open_session(
        self, run: str, *, session_id: str | None = None, **opening: Unpack[SessionOpening]
    ) -> SessionHandle:
        """Open a session with a fresh bearer token (only its sha256 is stored).

        ``session_id`` may be chosen by the caller (a worker hashing sessions onto several proxies);
        an id that already exists is refused (409): its token was handed out once. A fork names
        ``parent_session_id`` and ``fork_turn``: its first ``fork_turn`` turns are copied from the
        parent as its agent asks for them (:mod:`dressage.proxy.fork_replay`).
        """
        token = TOKEN_PREFIX + pysecrets.token_urlsafe(24)
        if session_id is not None and await asyncio.to_thread(self._session_exists, session_id):
            raise ConflictError(
                f"session {session_id!r} already exists; its token was given when it was opened",
                param="session_id",
                code="session_exists",
            )
        found = await asyncio.to_thread(self.store.runs.get, run)
        check_run_profile(found.name, found.config, self.profile)
        try:
            session = await asyncio.to_thread(
                self.store.sessions.open,
                run,
                session_id=session_id,
                token=token,
                **opening,
            )
        except ValueError as e:  # a fork's parent or fork turn that the log refuses
            param = "fork_turn" if "fork_turn" in str(e) else "parent_session_id"
            raise RequestError(str(e), param=param, code="invalid_fork") from e
        if session.parent_session_id is None:  # a fork is built from the log (its parent's turns)
            self.registry.adopt(token, session, found.name)
        return SessionHandle(session.id, token, self.session_url(token))

    def _session_exists(self, session_id: str) -> bool:
        try:
            self.store.sessions.get(session_id)
        except UnknownSessionError:
            return False
        return True

    async def take_over_session(
        self, session_id: str, *, attempt: int, info: Mapping[str, Any] | None = None
    ) -> SessionHandle:
        """Take over a running session for ``attempt`` with a fresh token (the old one stops working).

        The session keeps its turns; the new attempt's requests that match them are answered from
        the log (see :mod:`dressage.proxy.replay` and :mod:`dressage.store.sessions`). ``info``
        (where the new attempt runs) is recorded with the takeover.
        """
        token = TOKEN_PREFIX + pysecrets.token_urlsafe(24)
        session = await asyncio.to_thread(self.store.sessions.get, session_id)
        run = await asyncio.to_thread(self.store.runs.by_id, session.run_id)
        check_run_profile(run.name, run.config, self.profile)
        self.registry.evict(session_id)  # a cached state of the old attempt answers no one now
        await asyncio.to_thread(
            self.store.sessions.take_over, session_id, attempt=attempt, token=token, info=info
        )
        return SessionHandle(session_id, token, self.session_url(token))

    async def finalize_session(
        self, session_id: str, status: str, **outcome: Unpack[SessionOutcome]
    ) -> FinalizedSession:
        """Finalize (idempotently); the session's token is refused from now on.

        ``attempt``: refuse (:class:`~dressage.errors.LeaseError`) when another attempt took the
        session over. A taken-over session's replay counters join ``info`` as ``replay``.
        """
        state = self.registry.cached(session_id)
        if state is not None and state.replay is not None:
            outcome["info"] = {**(outcome.get("info") or {}), "replay": state.replay.summary()}
        self.registry.finish(session_id)
        session = await asyncio.to_thread(
            self.store.sessions.finalize,
            session_id,
            status,
            **outcome,
        )
        self.pool.release(session_id)
        return FinalizedSession(session.id, session.status, session.reward)

    async def pause(self) -> None:
        """Abort in-flight generations (keeping partial output) and hold new ones."""
        await self.coordinator.pause()
        self.metrics.paused.set(1)

    async def continue_generation(self, weight_version: int | None) -> None:
        """Continue every held or interrupted generation; later tokens carry ``weight_version``."""
        await self.coordinator.continue_generation(weight_version)
        self.metrics.paused.set(0)

    async def stop(self) -> None:
        """In-process: close engine connections and this loop's store connections."""
        await self.aclose()


async def _run_hook(hook: TurnBoundaryHook, session_id: str, request: TurnRequest) -> None:
    """Run a turn hook; a store or file failure of it is logged and never fails the turn (a hook
    records the failures it expects itself)."""
    try:
        await hook(request)
    except (DressageError, OSError):
        log.exception("the turn hook of session %s at turn %d failed", session_id, request.turn_index)


def _watches_turns(service: ProxyService) -> WatchesTurns:
    """mypy checks here that :class:`ProxyService` tells its owner about turn boundaries."""
    return service


def _implements_contract(service: ProxyService) -> Proxy:
    """mypy checks here that :class:`ProxyService` is a :class:`~dressage.proxy.contract.Proxy`."""
    return service
