"""The worker's side of sandbox checkpoints: take them at each turn boundary, start from them.

**Taking.** With a ``checkpoints:`` section and an in-process proxy
(:class:`~dressage.proxy.contract.WatchesTurns`), each episode registers a
:class:`SessionCheckpoints` hook for its session. When live request K arrives, the proxy starts
the hook and goes on to generate; the hook has the sandbox checkpoint itself
(:meth:`~dressage.paddock.base.Sandbox.checkpoint`: its writable roots walked in a worker thread,
files whose stat did not change since the last capture not read again; E2B: a snapshot), stores the changed
files and the manifest as blobs, the request's body as a blob, and records the checkpoint
(:mod:`dressage.store.sandbox_checkpoints`), then applies retention. The reply to request K is not
returned before the hook ended, so the agent cannot change its sandbox while it is read: the turn
waits only for what hashing takes beyond the generation (nothing when no file changed). A tree
over the caps, or a sandbox that cannot take one, gets a ``checkpoint_skipped`` event
instead (the turn goes on).

**Starting.** A fork at K (``dressage-worker fork``) or a take-over of an interrupted session
starts from the checkpoint of K when there is one and the agent can resume from its recorded
request (:meth:`~dressage.agents.base.Agent.resume_refusal`): :func:`load_start` says which, or
why not, and the session's ``info["start"]`` records the path it took (``checkpoint`` or
``replay`` with ``why``). :func:`restore_start` fills the fresh sandbox from the manifest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from dressage.agents import Agent, ResumePoint
from dressage.errors import SandboxError, StoreError, UnknownSessionError
from dressage.paddock import Sandbox
from dressage.paddock.checkpoints import Caps, Checkpointer, Manifest, change_rows, diff
from dressage.proxy.checkpoint_start import CHECKPOINT_START
from dressage.proxy.contract import TurnRequest
from dressage.redact import redact_json
from dressage.rollout.config import CHECKPOINT_PROVIDERS, CheckpointsConfig
from dressage.store import EventStore, Run, deterministic_key
from dressage.store.sandbox_checkpoints import SandboxCheckpoint

log = logging.getLogger(__name__)

MIB = 1024 * 1024
FALLBACK_REASONS = ("checkpoint_diverged", "checkpoint_restore_failed")
"""Failures of a checkpoint start after which a fork replays instead."""


@dataclass(frozen=True)
class StartPoint:
    """A checkpoint to start a session from: its record, its manifest and the agent's resume point."""

    checkpoint: SandboxCheckpoint
    manifest: Manifest
    point: ResumePoint

    def info(self, on_diverge: str) -> dict[str, object]:
        """The session's ``info["start"]`` for this start (``on_diverge``: ``refuse`` or ``record``)."""
        return {
            CHECKPOINT_START: {
                "path": "checkpoint",
                "turn": self.checkpoint.turn_index,
                "prompt_digest": self.checkpoint.prompt_digest,
                "manifest_sha256": self.checkpoint.manifest_sha256,
                "from": self.point.source,
                "on_diverge": on_diverge,
            }
        }


def provider_refusal(provider: str) -> str | None:
    """Why sessions on ``provider`` cannot start from a checkpoint (None: they can)."""
    if provider in CHECKPOINT_PROVIDERS:
        return None
    return f"checkpoints are not built for sandbox provider {provider!r} (only {', '.join(CHECKPOINT_PROVIDERS)})"


def replay_info(why: str) -> dict[str, object]:
    """The session's ``info["start"]`` of a fork or take-over that replays, and why."""
    return {CHECKPOINT_START: {"path": "replay", "why": why}}


def load_start(store: EventStore, session_id: str, turn_index: int, agent: Agent) -> StartPoint | str:
    """The checkpoint of ``session_id`` at ``turn_index`` to start from, or why there is none to use.

    A fork holds no checkpoint before its fork turn (its turns there are copies): one at such a turn
    is its parent's (and so on up the tree), the same state id for id."""
    found = _checkpoint_at(store, session_id, turn_index)
    if found is None:
        return f"session {session_id} has no sandbox checkpoint at turn {turn_index}"
    session_id = found.session_id
    raw = store.sandbox_checkpoints.read_request(found)
    if raw is None or found.prompt_digest is None:
        return f"the checkpoint of session {session_id} at turn {turn_index} records no request"
    request = orjson.loads(raw)
    point = ResumePoint(
        turn_index,
        str(request["dialect"]),
        dict(request["body"]),
        source=f"session {session_id} turn {turn_index}",
    )
    refusal = agent.resume_refusal(point)
    if refusal is not None:
        return refusal
    manifest = Manifest.from_bytes(store.sandbox_checkpoints.read_manifest(found))
    return StartPoint(found, manifest, point)


def _checkpoint_at(store: EventStore, session_id: str, turn_index: int) -> SandboxCheckpoint | None:
    """The checkpoint of turn ``turn_index`` of ``session_id``, or of the ancestor it shares that turn with."""
    found = store.sandbox_checkpoints.get(session_id, turn_index)
    session = store.sessions.get(session_id)
    while found is None and session.parent_session_id is not None and turn_index < (session.fork_turn or 0):
        try:
            session = store.sessions.get(session.parent_session_id)
        except UnknownSessionError:  # its parent's run was dropped
            return None
        found = store.sandbox_checkpoints.get(session.id, turn_index)
    return found


def latest_start(store: EventStore, session_id: str, up_to: int, agent: Agent) -> StartPoint | str:
    """The newest usable checkpoint of ``session_id`` at a turn ``<= up_to`` (a take-over: turns after
    it are replayed from the log), or why there is none."""
    turns = [c.turn_index for c in store.sandbox_checkpoints.by_session(session_id) if c.turn_index <= up_to]
    why = f"session {session_id} has no sandbox checkpoint at or before turn {up_to}"
    for k in sorted(turns, reverse=True):
        found = load_start(store, session_id, k, agent)
        if isinstance(found, StartPoint):
            return found
        why = found
    return why


async def restore_start(sandbox: Sandbox, start: StartPoint, store: EventStore) -> None:
    """Fill a fresh sandbox from the start's manifest (:meth:`Sandbox.restore_checkpoint`)."""
    if store.artifacts.blobs is None:
        raise StoreError("this store has no blob store: checkpoints cannot be restored")
    await sandbox.restore_checkpoint(start.manifest, store.artifacts.blobs)


class SessionCheckpoints:
    """The turn hook of one session: checkpoint its sandbox at each live request (module docstring)."""

    def __init__(
        self,
        store: EventStore,
        run: Run,
        session_id: str,
        sandbox: Sandbox,
        cfg: CheckpointsConfig,
        fork_turns: list[int],
        base: Manifest | None = None,
    ) -> None:
        if store.artifacts.blobs is None:
            raise StoreError("this store has no blob store: checkpoints cannot be taken")
        self.store, self.run, self.session_id, self.sandbox = store, run, session_id, sandbox
        self.cfg, self.fork_turns = cfg, fork_turns
        caps = Caps(max_file_bytes=cfg.max_file_mb * MIB, max_total_bytes=cfg.max_total_mb * MIB)
        self.checkpointer = Checkpointer(store.artifacts.blobs, caps)
        self.last = base
        self.kept: list[int] = [c.turn_index for c in store.sandbox_checkpoints.by_session(session_id)]
        self.seen: set[int] = set()
        self._one_at_a_time = asyncio.Lock()  # concurrent requests of a session: captures in turn order

    async def __call__(self, request: TurnRequest) -> None:
        """Checkpoint the sandbox for ``request`` (once per turn index; a turn the session holds a
        checkpoint of already, from an attempt before a take-over, keeps it)."""
        if request.turn_index in self.seen or request.turn_index in self.kept:
            return
        self.seen.add(request.turn_index)
        async with self._one_at_a_time:
            try:
                manifest = await self.sandbox.checkpoint(self.checkpointer)
            except SandboxError as e:  # over a cap, unreadable, or a provider without host folders
                await asyncio.to_thread(self._skipped, request.turn_index, str(e))
                return
            dropped = await asyncio.to_thread(self._record, request, manifest)
        for old in dropped:  # what a pruned checkpoint keeps outside the log (an E2B snapshot)
            try:
                await self.sandbox.drop_checkpoint(old)
            except SandboxError as e:
                log.warning("session %s: a pruned checkpoint was not released: %s", self.session_id, e)

    @classmethod
    async def for_session(
        cls,
        store: EventStore,
        run: Run,
        session_id: str,
        sandbox: Sandbox,
        cfg: CheckpointsConfig,
        fork_turns: list[int],
        base: Manifest | None = None,
    ) -> SessionCheckpoints:
        """Build the hook (it reads the session's checkpoints: off the event loop)."""
        return await asyncio.to_thread(cls, store, run, session_id, sandbox, cfg, fork_turns, base)

    def _record(self, request: TurnRequest, manifest: Manifest) -> list[Manifest]:
        """Store the manifest and the request, record the checkpoint, apply retention; the pruned
        manifests of a sandbox whose checkpoints keep state outside the log."""
        repo = self.store.sandbox_checkpoints
        _, uri = repo.put_manifest(manifest.to_bytes())
        req_sha, req_uri = repo.put_manifest(_request_doc(request, self.store.db.secrets))
        stats = self.checkpointer.last_stats
        record = SandboxCheckpoint(
            self.session_id,
            request.turn_index,
            manifest.sha256,
            uri,
            manifest.files,
            manifest.total_bytes,
            stats.hashed_bytes,
            request_sha256=req_sha,
            request_uri=req_uri,
            prompt_digest=request.prompt_digest,
        )
        repo.record(self.run, record, change_rows(diff(self.last, manifest)))
        self.last = manifest
        self.kept = sorted({*self.kept, request.turn_index})
        drop = self.cfg.to_prune(self.kept, self.fork_turns)
        dropped: list[Manifest] = []
        if drop:
            if self.sandbox.checkpoints_outside:
                found = [repo.get(self.session_id, k) for k in drop]
                dropped = [Manifest.from_bytes(repo.read_manifest(c)) for c in found if c is not None]
            repo.prune(self.run, self.session_id, drop, f"checkpoints.keep: {self.cfg.keep}")
            self.kept = [k for k in self.kept if k not in drop]
        return dropped

    def _skipped(self, turn_index: int, reason: str) -> None:
        """Record that turn ``turn_index`` has no checkpoint, and why."""
        log.warning("session %s: no checkpoint at turn %d: %s", self.session_id, turn_index, reason)
        self.store.events.append(
            self.run,
            "checkpoint_skipped",
            {"turn_index": turn_index, "reason": reason},
            key=deterministic_key(self.run.name, self.session_id, "checkpoint_skipped", turn_index),
            session_id=self.session_id,
        )


def _request_doc(request: TurnRequest, secrets: tuple[str, ...]) -> bytes:
    """The stored form of an agent's request: its dialect and its body (JSON, secrets redacted)."""
    try:
        body: Any = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        body = {}
    return orjson.dumps(
        {"dialect": request.dialect, "body": redact_json(body, secrets)}, option=orjson.OPT_SORT_KEYS
    )
