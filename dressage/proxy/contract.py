"""The proxy as rollout sees it: one session handle and one :class:`Proxy` protocol.

Three things implement :class:`Proxy`: the in-process :class:`~dressage.proxy.service.ProxyService`,
the standalone :class:`~dressage.proxy.server.ProxyServer` (the same service, also listening) and
the worker's ring of standalone proxies (:class:`~dressage.rollout.proxy_ring.ProxyRing`, over the
admin API). Rollout, the loop and the cluster actors import this module, never the implementations.

Vocabulary (see the glossary in docs/architecture.md): a session's ``info`` is the store's word for
its free-form facts (the admin API still accepts ``metadata``); *take over* is a new attempt taking
a running session (new token, same turns); *continue generation* is the proxy going on after a
weight update, with later tokens tagged with the new ``weight_version``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Unpack, runtime_checkable

from dressage.config import Settings
from dressage.store import EventStore, Run
from dressage.store.records import SessionOpening, SessionOutcome

Info = Mapping[str, object]
"""A session's free-form facts (JSON values), kept in the log as its ``info``."""


@dataclass(frozen=True)
class SessionHandle:
    """What an agent needs: the session id, its bearer token and its OpenAI base URL.

    ``base_url`` is ``{proxy}/s/{token}/v1`` (OpenAI chat completions and Responses);
    :attr:`anthropic_base_url` is the session's root, to which Anthropic clients add ``/v1/messages``.
    """

    session_id: str
    token: str
    base_url: str

    @property
    def openai_base_url(self) -> str:
        """The base URL of the OpenAI dialects (chat completions, Responses)."""
        return self.base_url

    @property
    def anthropic_base_url(self) -> str:
        """The base URL of the Anthropic Messages dialect (the session's root, without ``/v1``)."""
        return self.base_url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class FinalizedSession:
    """What finalizing a session answers: its id, its terminal status and its reward."""

    session_id: str
    status: str
    reward: float | None


class Proxy(Protocol):
    """The proxy operations rollout uses (in-process, standalone, or a ring of standalone proxies)."""

    @property
    def base_url(self) -> str:
        """The proxy's root URL (``http://host:port``); a ring answers its first proxy's."""
        ...

    async def create_run(self, name: str, config: Mapping[str, object] | None = None) -> Run:
        """Create run ``name`` (or get it when it exists with the same config)."""
        ...

    async def open_session(
        self, run: str, *, session_id: str | None = None, **opening: Unpack[SessionOpening]
    ) -> SessionHandle:
        """Open a session of run ``run`` with a fresh bearer token (``session_id``: the caller's
        choice, refused when it exists; ``parent_session_id`` + ``fork_turn``: a fork)."""
        ...

    async def take_over_session(
        self, session_id: str, *, attempt: int, info: Mapping[str, Any] | None = None
    ) -> SessionHandle:
        """Take over a running session for ``attempt`` with a fresh token (the old one stops working);
        ``info`` (where the new attempt runs) joins the session's info and its resume record."""
        ...

    async def finalize_session(
        self, session_id: str, status: str, **outcome: Unpack[SessionOutcome]
    ) -> FinalizedSession:
        """Finalize (idempotently); the session's token is refused from now on."""
        ...

    async def pause(self) -> None:
        """Abort in-flight generations (keeping partial output) and hold new ones."""
        ...

    async def continue_generation(self, weight_version: int | None) -> None:
        """Continue every held or interrupted generation; later tokens carry ``weight_version``."""
        ...

    async def stop(self) -> None:
        """Release what this proxy holds (a ring holds nothing: its proxies are not the worker's)."""
        ...


@dataclass(frozen=True)
class TurnRequest:
    """A live request of a session as it reaches the proxy: request ``turn_index`` (that many turns
    are recorded; the agent waits for the model), its dialect, its body as sent, and the sha256 of
    the prompt ids it renders to (:func:`dressage.proxy.replay.ids_digest`)."""

    turn_index: int
    dialect: str
    body: bytes
    prompt_digest: str


TurnBoundaryHook = Callable[[TurnRequest], Awaitable[None]]
"""Called when a live request reaches the proxy: the rollout worker checkpoints the session's
sandbox and keeps the request (:mod:`dressage.rollout.checkpointing`)."""


@runtime_checkable
class WatchesTurns(Protocol):
    """A proxy in this process that tells its owner when a session's request arrives (the in-process
    :class:`~dressage.proxy.service.ProxyService` and so :class:`~dressage.proxy.server.ProxyServer`).

    The hook runs concurrently with the turn's generation, and the turn's reply is not returned to
    the agent before it ended: the agent cannot change its sandbox while the hook reads it. The
    worker's ring of standalone proxies (other processes) does not implement it: their sessions get
    no checkpoints (forks and take-overs of them replay)."""

    def watch_turns(self, session_id: str, hook: TurnBoundaryHook) -> None:
        """Call ``hook`` at each live request of ``session_id`` until :meth:`unwatch_turns`."""
        ...

    def unwatch_turns(self, session_id: str) -> None:
        """Stop calling the session's hook."""
        ...


class ServedProxy(Proxy, Protocol):
    """A proxy this process starts and serves (``start`` before use, ``stop`` after)."""

    async def start(self) -> None:
        """Listen (on a free port when the port is 0); :attr:`base_url` is real afterwards."""
        ...


class ProxyFactory(Protocol):
    """How rollout builds the proxy it serves (:class:`~dressage.proxy.server.ProxyServer`)."""

    def __call__(
        self,
        store: EventStore,
        engine_urls: list[str],
        *,
        settings: Settings,
        profile: str,
        host: str,
        port: int,
        record_experts: bool,
        context_window: int | None,
        default_sampling: Mapping[str, object] | None,
    ) -> ServedProxy: ...
