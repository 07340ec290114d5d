"""Pushing trained weights to the inference engines: pause, ``update_weights_from_disk``, record, resume.

One push of policy version ``v`` (after trainer step ``v - initial_version``):

1. the backend saves the model as a Hugging Face directory (``config.json`` + ``*.safetensors``,
   what SGLang's and the dev engine's ``update_weights_from_disk`` load);
2. **pause** generation: through the TITO proxy's admin API (``POST /admin/pause``, which aborts
   in-flight requests keeping their partial output and pauses its engines) when a proxy admin URL
   is given, else each engine directly (``/pause_generation``);
3. ``update_weights_from_disk(path, weight_version=v)`` on every engine (concurrently);
4. :meth:`EventStore.versions.record` ``(run, v, uri)`` (idempotent per version, so a step
   redone after a crash pushes and records again harmlessly);
5. **continue**: ``POST /admin/continue {"version": v}`` (the proxy continues its engines and tags later
   tokens with ``v``), else each engine's ``/continue_generation``.

When a step fails after the pause, generation is left paused on purpose: resuming with some engines
on the new weights and some on the old would record tokens under the wrong version. The error names
the URL and what to do. The engines must see the weights directory at the same path (same machine
or a shared file system).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import httpx

from dressage.config import load_settings
from dressage.errors import ConfigError, EngineBroadcastError, TrainingError
from dressage.store.event_store import EventStore
from dressage.store.records import Run
from dressage.tls import tls_context

if TYPE_CHECKING:
    from dressage.engines.sglang_client import EnginePool

T = TypeVar("T")

ADMIN_TOKEN_ENV = "DRESSAGE_ADMIN_TOKEN"


def parse_urls(value: str, option: str = "--push-to") -> list[str]:
    """``URL[,URL...]`` → URLs without trailing slashes; each must be ``http(s)://``."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ConfigError(f"{option} needs at least one URL (e.g. http://127.0.0.1:30000)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{option}: {url!r} is not an http(s):// URL")
    return urls


def _run_sync(coro: Coroutine[object, object, T]) -> T:
    """Run ``coro`` to completion from synchronous code, also when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass(frozen=True)
class PushResult:
    """What one push did (for metrics and tests)."""

    version: int
    path: Path
    engines: tuple[str, ...]
    via_proxy: bool
    seconds: float


class WeightPusher:
    """Pushes saved weights to ``engine_urls`` and records the new policy version in ``store``.

    ``proxy_admin_urls`` (the proxies' base URLs: one, or every proxy of a ``proxy.urls`` deployment)
    make pause/resume go through the proxies (all paused before the engines load, all resumed after), with
    ``admin_token`` (default: ``$DRESSAGE_ADMIN_TOKEN``) as bearer. ``every`` pushes after every
    ``every``-th step; ``keep_last`` deletes all but the newest ``keep_last`` pushed directories
    (their URIs stay in the log; the per-step checkpoints are the durable copy).
    """

    def __init__(
        self,
        store: EventStore,
        engine_urls: Sequence[str],
        *,
        proxy_admin_urls: Sequence[str] = (),
        admin_token: str | None = None,
        every: int = 1,
        keep_last: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if not engine_urls:
            raise ConfigError("a weight push needs at least one engine URL (--push-to)")
        if every < 1:
            raise ConfigError(f"--push-every must be >= 1, got {every}")
        if keep_last is not None and keep_last < 1:
            raise ConfigError(f"--push-keep must be >= 1, got {keep_last}")
        self.store = store
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.proxy_admin_urls = [u.rstrip("/") for u in proxy_admin_urls]
        if admin_token is None:
            configured = load_settings().admin_token
            admin_token = configured.get_secret_value() if configured else None
        self.admin_token = admin_token
        settings = load_settings()
        self.engine_connect_timeout_s = settings.engine_connect_timeout_s
        self.proxy_connect_timeout_s = settings.proxy_connect_timeout_s
        if self.proxy_admin_urls and not self.admin_token:
            raise ConfigError(
                f"--proxy-admin-url {','.join(self.proxy_admin_urls)} needs the proxy's admin token: set "
                f"{ADMIN_TOKEN_ENV} to the token the proxy was started with"
            )
        self.every = every
        self.keep_last = keep_last
        self.timeout_s = timeout_s
        self._pushed: list[Path] = []

    def due(self, step: int) -> bool:
        """Whether step ``step`` ends with a push."""
        return step % self.every == 0

    def push(self, run: Run, version: int, weights_dir: Path) -> PushResult:
        """Pause, load ``weights_dir`` as ``version`` on every engine, record it, resume."""
        import time

        started = time.monotonic()
        path = Path(weights_dir).resolve()
        if not path.is_dir():
            raise TrainingError(f"weights directory {path} does not exist; save the model before pushing")
        _run_sync(self._push(run, version, path))
        self._pushed.append(path)
        self._prune()
        return PushResult(
            version,
            path,
            tuple(self.engine_urls),
            bool(self.proxy_admin_urls),
            time.monotonic() - started,
        )

    async def _push(self, run: Run, version: int, path: Path) -> None:
        from dressage.engines.sglang_client import EnginePool

        pool = EnginePool(
            self.engine_urls, timeout=self.timeout_s, connect_timeout=self.engine_connect_timeout_s
        )
        try:
            await self._pause(pool)
            try:
                await pool.update_weights_from_disk(str(path), version)
            except EngineBroadcastError as e:
                raise TrainingError(
                    f"update_weights_from_disk({path}, version {version}) failed on {_failed_on(e)}"
                    f". Generation is left paused ({self._paused_where()}) so no tokens are sampled from "
                    "mixed weights; fix the engine (path visible to it? same architecture?) and restart the "
                    "trainer, which redoes this step and pushes again"
                ) from e
            self.store.versions.record(run, version, path.as_uri())
            await self._resume(pool, version)
        finally:
            await pool.aclose()

    def _paused_where(self) -> str:
        if self.proxy_admin_urls:
            return "proxies " + ", ".join(self.proxy_admin_urls)
        return "engines " + ", ".join(self.engine_urls)

    async def _pause(self, pool: EnginePool) -> None:
        if self.proxy_admin_urls:
            await self._on_every_proxy("/admin/pause", {})
            return
        await _on_every_engine(pool.pause(), "pause_generation")

    async def _resume(self, pool: EnginePool, version: int) -> None:
        if self.proxy_admin_urls:
            await self._on_every_proxy("/admin/continue", {"version": version})
            return
        await _on_every_engine(pool.continue_(), "continue_generation")

    async def _on_every_proxy(self, route: str, body: dict[str, object]) -> None:
        """POST ``route`` to every proxy at once; the first failure is raised (after all answered)."""
        results = await asyncio.gather(
            *(self._admin(base, route, body) for base in self.proxy_admin_urls), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _admin(self, base: str, route: str, body: dict[str, object]) -> None:
        url = f"{base}{route}"
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        try:
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=self.proxy_connect_timeout_s),
                verify=tls_context(),
            ) as http:
                resp = await http.post(url, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise TrainingError(
                f"the proxy admin API at {url} is unreachable ({type(e).__name__}: {e}); check that the "
                "proxy runs and --proxy-admin-url is its base URL"
            ) from e
        if resp.status_code == 401:
            raise TrainingError(
                f"{url} refused the admin token (HTTP 401); set {ADMIN_TOKEN_ENV} to the proxy's"
            )
        if resp.status_code == 403:
            raise TrainingError(
                f"{url} has its admin API disabled (HTTP 403); start the proxy with {ADMIN_TOKEN_ENV} set"
            )
        if resp.status_code >= 400:
            raise TrainingError(
                f"{url} answered HTTP {resp.status_code}: {resp.text[:300]}; check the proxy's log"
            )

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        while len(self._pushed) > self.keep_last:
            shutil.rmtree(self._pushed.pop(0), ignore_errors=True)


def _failed_on(e: EngineBroadcastError) -> str:
    """``url: error; ...`` of the engines a broadcast failed on."""
    return "; ".join(f"{url}: {error}" for url, error in e.failures)


async def _on_every_engine(command: Coroutine[object, object, None], what: str) -> None:
    """Await a pool-wide engine command; its failure becomes a :class:`TrainingError` saying what to do."""
    try:
        await command
    except EngineBroadcastError as e:
        raise TrainingError(
            f"{what} failed on {_failed_on(e)}; check that every "
            "--push-to engine is running (generation on the others may be paused: call "
            "/continue_generation on them or restart the trainer)"
        ) from e
