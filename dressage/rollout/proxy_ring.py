"""Many proxies, one log: a worker spreads its sessions over ``proxy.urls`` by consistent hashing.

Every ``dressage-worker proxy`` process on one database serves every session (a cached state is
rebuilt from the log on first touch, and when another proxy recorded turns since). A session
still goes to one proxy while it lives, so its requests hit one engine's prefix cache: the
session id is hashed onto a ring of the proxies (:class:`HashRing`, ``VNODES`` points per proxy,
so removing one moves only its share of sessions). When the session's proxy is unreachable, its
requests go to the next proxy on the ring; the dead one is skipped for ``DEAD_S`` seconds. A proxy
that does not accept a connection within ``connect_timeout`` (``Settings.proxy_connect_timeout_s``)
counts as unreachable: a host that is gone answers no SYN, and without the bound each connection
waited out the kernel's retries (about 2 minutes) before failing over.

:class:`ProxyRing` is the worker's view of the proxies: the admin API (create the run, open and
finalize sessions, over HTTP with ``DRESSAGE_ADMIN_TOKEN``) and, per session, an HTTP client for
the agent (:meth:`ProxyRing.http_client`) whose transport fails over along the ring. A request
that the dead proxy may have recorded before dying is safe to send again: the next proxy rebuilds
the session from the log and answers the same request from its recorded turn (retry dedupe), so
nothing is generated or recorded twice.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Unpack
from urllib.parse import urlsplit

import httpx

from dressage.config import PROXY_CONNECT_TIMEOUT_S
from dressage.errors import ConfigError, DressageError, LeaseError
from dressage.paddock import serve_unix_socket_router
from dressage.proxy.contract import FinalizedSession, Proxy, SessionHandle
from dressage.store import EventStore, Run
from dressage.store.records import SessionOpening, SessionOutcome
from dressage.tls import tls_context

log = logging.getLogger(__name__)

VNODES = 64
"""Points per proxy on the ring: with 64 the share of each proxy is within a few percent of 1/P."""
DEAD_S = 5.0
"""How long an unreachable proxy is skipped before it is tried again."""
CONNECT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
"""The request never reached the proxy: always safe to send to the next one."""
FAILOVER_ERRORS = (*CONNECT_ERRORS, httpx.ReadError, httpx.RemoteProtocolError)
"""Also a proxy that died mid-request: safe for a turn (answered from the log if it was recorded)."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _handle(out: dict[str, Any]) -> SessionHandle:
    """The session handle in an admin answer ``{session_id, token, base_url}``."""
    return SessionHandle(str(out["session_id"]), str(out["token"]), str(out["base_url"]))


def host_port(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http(s)://host[:port]`` URL (the scheme's port when none is given)."""
    parts = urlsplit(url)
    assert parts.hostname is not None  # a proxy's URL (checked by HashRing, or our own server's)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class HashRing:
    """A consistent-hash ring of proxy URLs with ``vnodes`` virtual nodes each."""

    def __init__(self, urls: list[str], vnodes: int = VNODES) -> None:
        clean = [u.rstrip("/") for u in urls]
        if not clean:
            raise ConfigError("proxy.urls is empty: give at least one proxy URL")
        if len(set(clean)) != len(clean):
            raise ConfigError(f"proxy.urls lists a proxy twice: {clean}")
        for u in clean:
            parts = urlsplit(u)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"proxy URL {u!r} is not an http(s)://host:port URL")
        self.urls = clean
        self._points = sorted((_point(f"{u}#{i}"), u) for u in clean for i in range(vnodes))
        self._keys = [p for p, _ in self._points]

    def walk(self, key: str) -> list[str]:
        """Every proxy once, in ring order from ``key``'s point: the owner first, then its successors."""
        start = bisect.bisect(self._keys, _point(key))
        out: list[str] = []
        for i in range(len(self._points)):
            url = self._points[(start + i) % len(self._points)][1]
            if url not in out:
                out.append(url)
                if len(out) == len(self.urls):
                    break
        return out


class _Health:
    """Which proxies recently failed to answer (shared by every session of a worker)."""

    def __init__(self) -> None:
        self.dead_until: dict[str, float] = {}

    def order(self, candidates: list[str]) -> list[str]:
        """Live proxies first (in ring order), then the ones marked dead (a last resort)."""
        now = time.monotonic()
        live = [u for u in candidates if self.dead_until.get(u, 0.0) <= now]
        return live + [u for u in candidates if u not in live]

    def dead(self, url: str) -> None:
        if self.dead_until.get(url, 0.0) <= time.monotonic():
            log.warning("proxy %s is unreachable; its sessions move to the next proxy on the ring", url)
        self.dead_until[url] = time.monotonic() + DEAD_S


class FailoverTransport(httpx.AsyncBaseTransport):
    """Sends each request to the session's proxy, else to the next live one on the ring.

    Only the scheme, host and port change: paths (``/s/<token>/v1/...``) and the bearer token are
    the same on every proxy.
    """

    def __init__(
        self,
        ring: HashRing,
        health: _Health,
        key: str,
        errors: tuple[type[Exception], ...] = FAILOVER_ERRORS,
        connect_timeout: float = PROXY_CONNECT_TIMEOUT_S,
    ) -> None:
        self.ring = ring
        self.health = health
        self.key = key
        self.errors = errors
        self.connect_timeout = connect_timeout
        self.inner = httpx.AsyncHTTPTransport(verify=tls_context())

    def _bound_connect(self, request: httpx.Request) -> None:
        """Cap the request's connect timeout at ``connect_timeout``: a caller's own per-request
        timeout (the openai SDK sends its ``timeout``, e.g. 600 s, with every request) would
        otherwise hold a connect to a dead proxy for minutes before the next one is tried."""
        timeouts = dict(request.extensions.get("timeout") or {})
        connect = timeouts.get("connect")
        if connect is None or connect > self.connect_timeout:
            request.extensions = {
                **request.extensions,
                "timeout": {**timeouts, "connect": self.connect_timeout},
            }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self._bound_connect(request)
        last: Exception | None = None
        for base in self.health.order(self.ring.walk(self.key)):
            target = httpx.URL(base)
            request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
            try:
                return await self.inner.handle_async_request(request)
            except self.errors as e:
                self.health.dead(base)
                last = e
        assert last is not None
        raise last

    async def aclose(self) -> None:
        await self.inner.aclose()


class ProxyRing:
    """The worker's proxies: admin calls over HTTP and per-session failover clients (see the module);
    a :class:`~dressage.proxy.contract.Proxy`."""

    def __init__(
        self,
        urls: list[str],
        admin_token: str | None,
        store: EventStore,
        *,
        timeout: float = 60.0,
        connect_timeout: float = PROXY_CONNECT_TIMEOUT_S,
    ) -> None:
        if not admin_token:
            raise ConfigError(
                "proxy.urls needs the proxies' admin token: set DRESSAGE_ADMIN_TOKEN for the worker"
            )
        self.ring = HashRing(urls)
        self.health = _Health()
        self.store = store
        self._base_url = self.ring.urls[0]
        self._headers = {"authorization": f"Bearer {admin_token}"}
        self._timeout = timeout
        self.connect_timeout = connect_timeout

    @property
    def base_url(self) -> str:
        """The first proxy's root URL (admin calls go to a session's own proxy on the ring)."""
        return self._base_url

    async def _post(
        self, key: str, path: str, body: dict[str, Any], errors: tuple[type[Exception], ...] = FAILOVER_ERRORS
    ) -> dict[str, Any]:
        """POST to the admin API of ``key``'s proxy (failing over along the ring on ``errors``)."""
        transport = FailoverTransport(self.ring, self.health, key, errors, self.connect_timeout)
        return await self._send(transport, self._base_url, path, body)

    async def _send(
        self, transport: httpx.AsyncBaseTransport, base_url: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` through ``transport``; an error answer raises its message."""
        try:
            async with httpx.AsyncClient(
                transport=transport,
                base_url=base_url,
                headers=self._headers,
                timeout=self._timeouts(self._timeout),
            ) as client:
                resp = await client.post(path, json=body)
        except httpx.HTTPError as e:
            raise DressageError(f"no proxy of {self.ring.urls} answered {path}: {e!r}") from e
        if resp.status_code >= 400:
            try:
                error = resp.json()["error"]
                message, code = str(error["message"]), error.get("code")
            except (ValueError, KeyError, TypeError, AttributeError):
                message, code = resp.text[:500], None
            if code == "lease_lost":  # another attempt took the session over (as in-process)
                raise LeaseError(message)
            raise DressageError(f"proxy admin {path} answered {resp.status_code}: {message}")
        out: dict[str, Any] = resp.json()
        return out

    async def _on_every_proxy(self, path: str, body: dict[str, Any]) -> None:
        """POST to each proxy of the ring in turn (no failover: each one must hear it)."""
        for url in self.ring.urls:
            await self._send(httpx.AsyncHTTPTransport(verify=tls_context()), url, path, body)

    async def create_run(self, name: str, config: Mapping[str, object] | None = None) -> Run:
        """Create (or get) the run through a proxy, so its config records the proxies' model profile."""
        await self._post(name, "/admin/runs", {"name": name, "config": dict(config or {})})
        return await asyncio.to_thread(self.store.runs.get, name)

    async def open_session(
        self, run: str, *, session_id: str | None = None, **opening: Unpack[SessionOpening]
    ) -> SessionHandle:
        """Open a session on the proxy its id (fresh unless given) hashes to; any proxy serves it afterwards."""
        sid = session_id or uuid.uuid4().hex
        body = {"run": run, "session_id": sid, **{k: v for k, v in opening.items() if v is not None}}
        # Only a refused connection moves an open: a proxy that died after opening it holds its token.
        return _handle(await self._post(sid, "/admin/sessions", body, CONNECT_ERRORS))

    async def take_over_session(
        self, session_id: str, *, attempt: int, info: Mapping[str, Any] | None = None
    ) -> SessionHandle:
        """Take over an interrupted session for ``attempt`` through its proxy on the ring (the new
        token's requests that match recorded turns are answered from the log); ``info`` says where
        the new attempt runs."""
        path = f"/admin/sessions/{session_id}/take_over"
        body: dict[str, Any] = {"attempt": attempt, **({"info": dict(info)} if info else {})}
        return _handle(await self._post(session_id, path, body))

    async def finalize_session(
        self, session_id: str, status: str, **outcome: Unpack[SessionOutcome]
    ) -> FinalizedSession:
        """Finalize through the session's proxy (idempotent; every proxy then refuses its token)."""
        body = {"status": status, **outcome}
        out = await self._post(session_id, f"/admin/sessions/{session_id}/finalize", body)
        reward_out = out.get("reward")
        return FinalizedSession(
            str(out["session_id"]), str(out["status"]), float(reward_out) if reward_out is not None else None
        )

    async def pause(self) -> None:
        """Pause generation on every proxy of the ring (a weight update)."""
        await self._on_every_proxy("/admin/pause", {})

    async def continue_generation(self, weight_version: int | None) -> None:
        """Continue generation on every proxy; later tokens carry ``weight_version``."""
        await self._on_every_proxy("/admin/continue", {"version": weight_version})

    def _timeouts(self, timeout: float) -> httpx.Timeout:
        """``timeout`` for reads and writes, the connect bounded by ``connect_timeout``."""
        return httpx.Timeout(timeout, connect=min(timeout, self.connect_timeout))

    def http_client(self, session_id: str, timeout: float) -> httpx.AsyncClient:
        """An HTTP client for the agent's OpenAI client: requests follow the session's proxy on the ring."""
        return httpx.AsyncClient(
            transport=FailoverTransport(
                self.ring, self.health, session_id, connect_timeout=self.connect_timeout
            ),
            timeout=self._timeouts(timeout),
        )

    async def serve_session_socket(self, session_id: str, path: str) -> asyncio.Server:
        """A Unix socket at ``path`` for one session's sandbox (a blackbox agent without network):
        each connection goes to the session's proxy, or along the ring when it refuses."""

        def targets() -> list[tuple[str, int]]:
            return [host_port(url) for url in self.health.order(self.ring.walk(session_id))]

        by_target = {host_port(url): url for url in self.ring.urls}
        return await serve_unix_socket_router(
            path, targets, lambda t: self.health.dead(by_target[t]), connect_timeout=self.connect_timeout
        )

    async def stop(self) -> None:
        """Nothing to stop: the proxies are not this worker's (the same interface as ProxyServer)."""


def _implements_contract(ring: ProxyRing) -> Proxy:
    """mypy checks here that :class:`ProxyRing` is a :class:`~dressage.proxy.contract.Proxy`."""
    return ring
