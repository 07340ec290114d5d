"""One episode: a claimed (task, sample) from proxy session to released lease.

Order of effects (each one durable before the next):

1. a finished session for this task already exists (a worker died between finalize and release)
   -> release the lease as ``done`` and stop: nothing is counted twice;
2. open a proxy session (``session_started``), or with ``worker.resume_in_flight`` take over the
   session an earlier, interrupted attempt left running (``session_resumed``: new token, same turns,
   the agent's matching requests answered from the log, the first attempt's sampling seed), start
   renewing the lease every ``lease_s / 3``;
3. create the sandbox, run the agent under ``session_timeout_s`` (or its task kind's shorter agent timeout);
4. score; append the ``reward`` event (value + details);
5. archive the workspace and the agent log (redacted: see :mod:`dressage.redact`) as artifacts;
6. finalize the session (``finished`` with its reward, or ``failed`` with the error), then release
   the lease (``done``, or ``retry`` until ``max_attempts``).

A sandbox that fails to start, an agent that crashes or hangs, a reward that fails: each is a
*failed attempt* (kept in the log, never trained on) and the task goes back to the queue, until
``max_attempts``. An agent that failed because an engine died is no failed attempt but an
*interrupted* one (an infrastructure fault: :func:`interrupt_for_engine`): the task goes back to the
queue whatever attempt it was, and the next attempt continues the session on a live engine. If the
lease is lost (this worker stalled past it and another worker took the task, abandoning this
session), the episode stops without writing anything more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from dressage.agents import Agent, AgentContext, AgentLog, AgentResult, BlackboxAgent, Task
from dressage.cleanup import logged_failures
from dressage.errors import (
    AgentError,
    ConfigError,
    DressageError,
    LeaseError,
    RewardError,
    SandboxError,
    StoreError,
)
from dressage.paddock import Sandbox, SandboxProvider, SandboxSpec, SandboxTools
from dressage.proxy.contract import Proxy, SessionHandle, WatchesTurns
from dressage.redact import redact, redact_json
from dressage.rollout import task_kinds
from dressage.rollout.checkpointing import (
    SessionCheckpoints,
    StartPoint,
    latest_start,
    provider_refusal,
    replay_info,
    restore_start,
)
from dressage.rollout.config import RolloutConfig
from dressage.rollout.engine_health import EngineSupervisor, is_engine_fault
from dressage.rollout.proxy_ring import ProxyRing
from dressage.rollout.rewards import RewardInput, Scorer
from dressage.rollout.secrets import RunSecrets
from dressage.store import EventStore, Run, TaskLease, deterministic_key
from dressage.store.sessions import seed_attempt
from dressage.tls import tls_context

if TYPE_CHECKING:
    from openai import DefaultAsyncHttpxClient

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 2000


@dataclass
class EpisodeEnv:
    """What every episode of one worker shares."""

    store: EventStore
    proxy: Proxy
    run: Run
    cfg: RolloutConfig
    agent: Agent
    scorer: Scorer
    provider: SandboxProvider
    proxy_socket: str | None
    sandbox_proxy_url: str
    secrets: RunSecrets = field(default_factory=RunSecrets)
    session_socket_dir: str | None = None
    """With several standalone proxies (``proxy.urls``) and blackbox agents without network: the
    directory of the per-session sockets to the session's proxy on the ring (instead of ``proxy_socket``)."""
    session_info: dict[str, Any] = field(default_factory=dict)
    """Joins every session's ``info`` (e.g. the Ray node that ran it: :mod:`dressage.cluster.actors`)."""
    engines: EngineSupervisor | None = None
    """The engines' supervisor when this worker runs its own proxy (:mod:`dressage.rollout.engine_health`)."""


@dataclass
class Outcome:
    """How an episode ended: ``finished``, ``failed``, ``skipped`` (already done), ``lease_lost`` or
    ``interrupted`` (an engine died: an infrastructure fault, the pair goes back to the queue)."""

    status: str
    reward: float | None = None
    error: str | None = None


@dataclass
class Held:
    """Resources an episode must release however it ends."""

    sandbox: Sandbox | None = None
    client: Any = None
    forwarder: asyncio.Server | None = None
    spec: SandboxSpec | None = None
    artifacts: dict[str, bytes] = field(default_factory=dict)
    """Files the task's kind stores with the session (e.g. its image's build log), kept from the start."""
    watched: WatchesTurns | None = None
    """The proxy whose turn hook checkpoints this session's sandbox."""

    async def release(self, sid: str) -> None:
        """Close the agent's client, terminate the sandbox, stop the session's socket (failures logged)."""
        if self.watched is not None:
            self.watched.unwatch_turns(sid)
        if self.client is not None:
            with logged_failures(log, f"closing the OpenAI client of session {sid}"):
                await self.client.close()
        if self.sandbox is not None:
            with logged_failures(log, f"terminating the sandbox of session {sid}"):
                await self.sandbox.terminate()
        if self.forwarder is not None:
            self.forwarder.close()


class EpisodeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def renew_lease(
    env: EpisodeEnv, lease: TaskLease, owner_task: asyncio.Task[object], lost: list[bool]
) -> None:
    """Renew the lease every third of its length; on loss, cancel the episode."""
    lease_s = env.cfg.worker.lease_s
    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            lease = await asyncio.to_thread(env.store.tasks.renew, lease, lease_s)
        except LeaseError:
            lost[0] = True
            owner_task.cancel()
            return
        except StoreError as e:  # a database hiccup: try again next period, the lease has slack
            log.warning("renewing lease of task %s failed: %s", lease.task_id, e)


def sandbox_session_url(env: EpisodeEnv, host_session_url: str) -> str:
    """The session's OpenAI base URL as seen from inside the sandbox."""
    if env.session_socket_dir is not None:  # a per-session socket to the session's proxy: keep the path
        return env.sandbox_proxy_url.rstrip("/") + urlsplit(host_session_url).path
    base = env.proxy.base_url.rstrip("/")
    if not host_session_url.startswith(base):
        return host_session_url  # one of several standalone proxies (proxy.urls): reached directly
    return env.sandbox_proxy_url.rstrip("/") + host_session_url[len(base) :]


async def run_episode(env: EpisodeEnv, lease: TaskLease, *, release: bool = True) -> Outcome:
    """Play one claimed (task, sample); see the module docstring. Never raises for agent failures.

    ``release=False`` (a tree's root, :mod:`dressage.rollout.branching`): a finished (or already
    finished) session keeps the lease, which the tree releases once its branches have ended.
    """
    store, run, cfg = env.store, env.run, env.cfg
    if await asyncio.to_thread(store.sessions.has_finished, lease.task_id):
        if not release:
            return Outcome("skipped")
        with contextlib.suppress(LeaseError):
            await asyncio.to_thread(store.tasks.release, lease, "done")
        return Outcome("skipped")
    task = Task.from_payload(lease.payload)
    mark = env.engines.mark() if env.engines is not None else 0
    handle, seed_from, start = await _open_or_resume(env, lease)
    sid = handle.session_id
    current = asyncio.current_task()
    assert current is not None
    lost = [False]
    renewer = asyncio.create_task(renew_lease(env, lease, current, lost))
    agent_log = AgentLog()
    held = Held()
    sampling = cfg.sampling.request_kwargs(
        task_index=lease.task_index, sample_index=lease.sample_index, attempt=seed_from
    )
    try:
        try:
            result = await play_agent(env, task, handle, agent_log, held, sampling, start)
            reward, details = await score_result(env, task, result, held)
        except EpisodeFailed as f:
            return await _episode_failed(env, lease, sid, f, (held, agent_log, renewer, mark))
        await asyncio.to_thread(
            store.events.append,
            run,
            "reward",
            redact_json({"reward": reward, "details": details}, store.db.secrets),
            key=deterministic_key(run.name, sid, "reward"),
            session_id=sid,
        )
        await archive_session(env, sid, held.sandbox, agent_log, held.artifacts)
        renewer.cancel()
        await env.proxy.finalize_session(
            sid,
            "finished",
            reward=reward,
            finish_reason=result.finish_reason,
            info=redact_json(
                {**env.session_info, **_finish_info(lease, result), **_no_scalar(details)}, store.db.secrets
            ),
            attempt=lease.attempt,
        )
        if release:
            await asyncio.to_thread(store.tasks.release, lease, "done")
        return Outcome("finished", reward=reward)
    except asyncio.CancelledError:
        if not lost[0]:
            raise
        return Outcome("lease_lost", error=f"lease of task {lease.task_id} lost; session {sid} was abandoned")
    except (LeaseError, StoreError) as e:
        # Our session was abandoned by a worker that reclaimed the expired lease: nothing more to write.
        return Outcome("lease_lost", error=str(e))
    finally:
        renewer.cancel()
        await held.release(sid)


async def _episode_failed(
    env: EpisodeEnv,
    lease: TaskLease,
    sid: str,
    f: EpisodeFailed,
    state: tuple[Held, AgentLog, asyncio.Task[None], int],
) -> Outcome:
    """An episode that failed: an infrastructure interruption when an engine died meanwhile (the pair
    goes back to the queue), else a ``failed`` session and a retry (or ``failed`` pair)."""
    held, agent_log, renewer, mark = state
    store, cfg = env.store, env.cfg
    error = redact(str(f), store.db.secrets) or ""
    fault = await _engine_fault(env, mark, error) if f.reason.startswith("agent_") else None
    if fault is not None:
        renewer.cancel()
        return await interrupt_for_engine(env, lease, sid, error, held, agent_log, counts=fault == "reported")
    agent_log.write(f"FAILED ({f.reason}): {error}")
    await archive_session(env, sid, held.sandbox, agent_log, held.artifacts)
    renewer.cancel()
    await env.proxy.finalize_session(
        sid,
        "failed",
        finish_reason=f.reason,
        error=error,
        info={**env.session_info, **_finish_info(lease, None)},
        attempt=lease.attempt,
    )
    await asyncio.to_thread(store.tasks.release, lease, "retry", max_attempts=cfg.worker.max_attempts)
    return Outcome("failed", error=error)


async def _engine_fault(env: EpisodeEnv, mark: int, error: str) -> str | None:
    """Whether a failed episode failed because an engine died (an infrastructure fault, not the
    agent's): ``seen`` (this worker's supervisor saw an engine die since ``mark``: it claims nothing
    while none is up), ``reported`` (only the proxy's answer says its engine is unreachable:
    standalone proxies, or a connection an engine dropped without dying) or None."""
    if env.engines is not None and await env.engines.faulted_since(mark):
        return "seen"
    return "reported" if is_engine_fault(error) else None


async def interrupt_for_engine(
    env: EpisodeEnv,
    lease: TaskLease,
    sid: str,
    error: str,
    held: Held,
    agent_log: AgentLog,
    *,
    counts: bool = False,
) -> Outcome:
    """End an attempt that an engine's death interrupted: an infrastructure fault, never a task failure.

    The ``session_interrupted`` event records it (``failure_kind: infrastructure``). With
    ``worker.resume_in_flight`` the session stays ``running`` and the next attempt takes it over on a
    live engine (its recorded turns answered from the log); otherwise it is ``abandoned`` with
    finish reason ``engine_unreachable``. The lease goes back to the queue whatever attempt it was
    (the supervisor holds claims while no engine is up), unless ``counts``: a fault no supervisor
    saw (standalone proxies, or an engine that dropped a connection and lives on) uses up an
    attempt, so a worker whose engines never come back, or a request an engine always drops, does
    not retry forever; the pair then ends ``failed`` on infrastructure, which ``rollout --resume``
    retries.
    """
    store, run, cfg = env.store, env.run, env.cfg
    payload = {"failure_kind": "infrastructure", "reason": "engine_unreachable", "error": error}
    await asyncio.to_thread(
        store.events.append,
        run,
        "session_interrupted",
        {**payload, "attempt": lease.attempt},
        key=deterministic_key(run.name, sid, "interrupted", lease.attempt),
        session_id=sid,
    )
    if not cfg.worker.resume_in_flight:
        agent_log.write(f"INTERRUPTED (engine_unreachable): {error}")
        await archive_session(env, sid, held.sandbox, agent_log, held.artifacts)
        await env.proxy.finalize_session(
            sid,
            "abandoned",
            finish_reason="engine_unreachable",
            error=error,
            info={**env.session_info, **_finish_info(lease, None), "failure_kind": "infrastructure"},
            attempt=lease.attempt,
        )
    limit = cfg.worker.max_attempts if counts else None
    await asyncio.to_thread(store.tasks.release, lease, "retry", max_attempts=limit)
    return Outcome("interrupted", error=error)


async def _open_or_resume(env: EpisodeEnv, lease: TaskLease) -> tuple[SessionHandle, int, StartPoint | None]:
    """The episode's session, the attempt whose sampling seed it uses, and the checkpoint it starts from.

    With ``worker.resume_in_flight``, the running session of an earlier attempt of this (task,
    sample) is taken over (it keeps its turns and its first attempt's seed, so a deterministic agent
    sends the same requests again); otherwise, or if it ended meanwhile, a new session is opened.
    A taken-over session starts from its newest sandbox checkpoint when the run takes them and the
    agent can resume (turns recorded after it are replayed from the log); else it replays, and its
    ``info["start"]`` says why.
    """
    store = env.store
    if env.cfg.worker.resume_in_flight:
        old = await asyncio.to_thread(store.sessions.interrupted, lease.task_id, lease.attempt)
        if old is not None:
            start, why = await _take_over_start(env, old.id)
            info = dict(env.session_info)
            if env.cfg.checkpoints is not None:  # runs without checkpoints take over as they always did
                info.update(start.info("record") if start else replay_info(why))
            with contextlib.suppress(LeaseError):  # finalized meanwhile: open a new one
                handle = await env.proxy.take_over_session(old.id, attempt=lease.attempt, info=info)
                log.info("attempt %d of task %s resumes session %s", lease.attempt, lease.task_id, old.id)
                return handle, seed_attempt(old), start
    handle = await env.proxy.open_session(
        env.run.name,
        task_id=lease.task_id,
        attempt=lease.attempt,
        agent=env.agent.name,
        sandbox=env.cfg.sandbox.provider,
        info={**env.session_info, **_session_info(lease)},
    )
    return handle, lease.attempt, None


async def _take_over_start(env: EpisodeEnv, session_id: str) -> tuple[StartPoint | None, str]:
    """The checkpoint a take-over of ``session_id`` starts from, or why it replays."""
    if env.cfg.checkpoints is None:
        return None, "the run takes no sandbox checkpoints (no checkpoints: section)"
    refusal = provider_refusal(env.cfg.sandbox.provider)
    if refusal is not None:
        return None, refusal
    recorded = (await asyncio.to_thread(env.store.sessions.head, session_id)).turns
    found = await asyncio.to_thread(latest_start, env.store, session_id, recorded, env.agent)
    return (found, "") if isinstance(found, StartPoint) else (None, found)


def _agent_http_client(env: EpisodeEnv, session_id: str) -> httpx.AsyncClient | DefaultAsyncHttpxClient:
    """The HTTP client under an episode's OpenAI client. Several standalone proxies: its transport
    follows the session along the hash ring. Otherwise openai's default client, on the process's
    shared TLS context (:mod:`dressage.tls`): building a context per episode cost ~40 ms of CPU."""
    from openai import DefaultAsyncHttpxClient

    if isinstance(env.proxy, ProxyRing):
        return env.proxy.http_client(session_id, env.cfg.worker.session_timeout_s)
    return DefaultAsyncHttpxClient(verify=tls_context())


async def play_agent(
    env: EpisodeEnv,
    task: Task,
    handle: SessionHandle,
    agent_log: AgentLog,
    held: Held,
    sampling: dict[str, object],
    start: StartPoint | None = None,
) -> AgentResult:
    """Create the sandbox and run the agent; failures raise :class:`EpisodeFailed`.

    ``start``: the sandbox is filled from that checkpoint and the agent resumes from its recorded
    request (:mod:`dressage.rollout.checkpointing`); a restore that fails raises
    ``checkpoint_restore_failed``."""
    from openai import AsyncOpenAI

    cfg = env.cfg
    socket_path = (
        await _proxy_socket(env, handle.session_id, held) if isinstance(env.agent, BlackboxAgent) else None
    )
    spec = cfg.sandbox.spec(task.files, socket_path, env.secrets.sandbox)
    try:
        held.artifacts = task_kinds.artifacts(task)
        spec = held.spec = task_kinds.sandbox_spec(spec, task, cfg.sandbox.e2b.templates)
        sandbox = held.sandbox = await env.provider.create(handle.session_id, spec)
    except (SandboxError, ConfigError, OSError) as e:
        raise EpisodeFailed("sandbox_failed", f"sandbox {cfg.sandbox.provider} failed to start: {e}") from e
    await _checkpoints(env, handle.session_id, sandbox, held, start)
    agent_timeout = task_kinds.agent_timeout_s(task, cfg.worker.session_timeout_s)
    client = held.client = AsyncOpenAI(
        base_url=handle.base_url,
        api_key=handle.token,
        max_retries=2,
        timeout=cfg.worker.session_timeout_s,
        # (openai types it as its httpx2 client; it takes an httpx one at run time too.)
        http_client=_agent_http_client(env, handle.session_id),  # type: ignore[arg-type]
    )
    ctx = AgentContext(
        task=task,
        client=client,
        model=cfg.engine.model_name,
        sandbox=sandbox,
        tools=SandboxTools(sandbox),
        session_id=handle.session_id,
        token=handle.token,
        sandbox_base_url=sandbox_session_url(env, handle.base_url),
        sampling=sampling,
        timeout_s=agent_timeout,
        log=agent_log,
        secret_env=dict(env.secrets.agent),
    )
    try:
        playing = env.agent.run(ctx) if start is None else env.agent.resume(ctx, start.point)
        result = await asyncio.wait_for(playing, timeout=agent_timeout + 5)
    except TimeoutError:
        raise EpisodeFailed("agent_timeout", f"agent {env.agent.name} ran past {agent_timeout:g}s") from None
    except (AgentError, SandboxError) as e:
        raise EpisodeFailed("agent_error", f"agent {env.agent.name}: {e}") from e
    except Exception as e:  # an agent is user code: any crash is a failed attempt, with its traceback logged
        agent_log.write(traceback.format_exc())
        raise EpisodeFailed(
            "agent_crashed", f"agent {env.agent.name} crashed: {type(e).__name__}: {e}"
        ) from e
    return result


async def _checkpoints(
    env: EpisodeEnv, session_id: str, sandbox: Sandbox, held: Held, start: StartPoint | None
) -> None:
    """Restore ``start`` into the fresh sandbox, then have the proxy checkpoint it at each turn (with
    a ``checkpoints:`` section and a proxy in this process)."""
    if start is not None:
        try:
            await restore_start(sandbox, start, env.store)
        except (SandboxError, StoreError, OSError) as e:
            raise EpisodeFailed(
                "checkpoint_restore_failed", f"restoring the checkpoint of {start.point.source} failed: {e}"
            ) from e
    cfg = env.cfg.checkpoints
    if cfg is None or not isinstance(env.proxy, WatchesTurns):
        return
    forks = list(env.cfg.branching.turns or ()) if env.cfg.branching is not None else []
    base = start.manifest if start is not None else None
    hook = await SessionCheckpoints.for_session(env.store, env.run, session_id, sandbox, cfg, forks, base)
    env.proxy.watch_turns(session_id, hook)
    held.watched = env.proxy


async def _proxy_socket(env: EpisodeEnv, session_id: str, held: Held) -> str | None:
    """The host socket a blackbox agent's sandbox reaches the proxy through (None: over the network)."""
    if env.session_socket_dir is None or not isinstance(env.proxy, ProxyRing):
        return env.proxy_socket
    path = str(Path(env.session_socket_dir) / f"{session_id}.sock")
    held.forwarder = await env.proxy.serve_session_socket(session_id, path)
    return path


def _no_scalar(details: dict[str, Any]) -> dict[str, Any]:
    """``{"no_scalar_reward": why}`` for a session whose rewards hold no trained number, else ``{}``."""
    why = details.get("no_scalar_reward")
    return {"no_scalar_reward": why} if isinstance(why, str) else {}


async def score_result(
    env: EpisodeEnv, task: Task, result: AgentResult, held: Held
) -> tuple[float | None, dict[str, Any]]:
    """Score the agent's result: the trained number (None: the scorer kept every value but none is
    the one that trains, ``details["no_scalar_reward"]`` says why) and the details."""
    sandbox, spec = held.sandbox, held.spec
    assert sandbox is not None and spec is not None

    async def fresh_sandbox() -> Sandbox:
        return await env.provider.create(f"{sandbox.session_id}-verifier", spec)

    try:
        out = await env.scorer.score(
            RewardInput(
                task=task, answer=result.answer, result=result, sandbox=sandbox, fresh_sandbox=fresh_sandbox
            )
        )
    except (RewardError, SandboxError) as e:
        raise EpisodeFailed("reward_error", f"reward {env.scorer.kind}: {e}") from e
    return out.reward, out.details


async def archive_session(
    env: EpisodeEnv,
    sid: str,
    sandbox: Sandbox | None,
    agent_log: AgentLog,
    extra: Mapping[str, bytes] | None = None,
) -> None:
    """Store the agent log, ``extra`` (its task kind's files, redacted) and (if configured) the
    workspace tarball as the session's artifacts."""
    store, run = env.store, env.run
    try:
        for name, data in (extra or {}).items():
            text = redact(data.decode("utf-8", "replace"), store.db.secrets) or ""
            await asyncio.to_thread(
                store.artifacts.put, run, text.encode(), name=name, media_type="text/plain", session_id=sid
            )
        await asyncio.to_thread(
            store.artifacts.put,
            run,
            (redact(agent_log.text(), store.db.secrets) or "").encode(),
            name="agent.log",
            media_type="text/plain",
            session_id=sid,
        )
        if sandbox is not None and env.cfg.worker.archive_workspace:
            data = await sandbox.archive()
            await asyncio.to_thread(
                store.artifacts.put,
                run,
                data,
                name="workspace.tar.gz",
                media_type="application/gzip",
                session_id=sid,
            )
    except (SandboxError, DressageError) as e:
        log.warning("archiving session %s failed: %s", sid, e)


def _session_info(lease: TaskLease) -> dict[str, Any]:
    """The session's ``info``: its place in the queue, and for an eval session the version it evaluates."""
    info: dict[str, object] = {
        "task_index": lease.task_index,
        "sample_index": lease.sample_index,
        "group_index": lease.group_index,
    }
    if lease.kind == "eval":
        info["eval_version"] = lease.eval_version
    return info


def _finish_info(lease: TaskLease, result: AgentResult | None) -> dict[str, Any]:
    meta: dict[str, object] = {**_session_info(lease), "attempt": lease.attempt}
    if result is not None:
        meta.update(
            turns=result.turns,
            answer=result.answer[:MAX_ANSWER_CHARS],
            agent_finish_reason=result.finish_reason,
        )
    return meta
