"""The trainer as a log consumer ``train:<name>``: tail, form steps, train, commit; and replay.

Exactly-once effect (the log's rule 5, docs/architecture.md): for each step the backend first does its work (an
optimizer step and a checkpoint carrying ``(run, position, step)``, or a rollout file), then the
step manifest, its batch hash and the consumer checkpoint are committed in one transaction
(:meth:`EventStore.consumers.commit_step`). After a crash the trainer resumes at the step after the last
committed one; the cursor in the checkpoint state makes the next batch byte-identical to what an
uninterrupted run would have formed. Replay re-forms every recorded step and checks its hash.

With a ``reader`` (a streaming replica), groups and turns are read from it and everything else
(checkpoints, step commits) from and to the primary; before each look at the log the replica is
waited for until it has replayed all the primary held at that moment, so the batches are
byte-identical to the ones the primary would give.

A step that would train no token is never committed silently (:mod:`dressage.training.health`):
with ``empty_steps`` ``stop`` the trainer raises :class:`TrainingError` saying why, with ``skip``
the step builder consumed such groups and the next step's manifest and warnings say so. The
backend's metrics go through a :class:`~dressage.training.health.CollapseWatch`; its warnings are
logged (``dressage.training``), kept in the step's manifest (``warnings``) and returned with the
step (:attr:`StepResult.warnings`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dressage.errors import ReplayDriftError, TrainingError
from dressage.store.event_store import EventStore
from dressage.store.records import ConsumerCheckpoint, Run, TrainStep
from dressage.store.replica import REPLAY_TIMEOUT_S, wait_for_replay
from dressage.training.decisions import decision_drift, step_decisions
from dressage.training.groups import START_CURSOR, Cursor, GroupTracker, ReadyGroup
from dressage.training.health import CollapseWatch, empty_step_reason, skipped_warning, unformed_warning
from dressage.training.manifest import first_drift
from dressage.training.metrics import batch_metrics, checked, same
from dressage.training.steps import StepBatch, StepBuilder, StepOptions

log = logging.getLogger("dressage.training")
log.addHandler(logging.NullHandler())  # a library's logger: shown where the application configures logging


class Backend(Protocol):
    """What consumes a formed step: an optimizer (torch), a file writer (slime-dump), or nothing."""

    name: str

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Restore state matching the consumer checkpoint (before the first step, ``None``)."""

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """Do the step's work durably (before the commit); return its metrics (recorded with the
        step, see :mod:`dressage.training.metrics`)."""


class NullBackend:
    """Forms and records steps without training (audits, dry runs, the replay of a run)."""

    name = "none"

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Nothing to restore."""

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """Nothing to do."""
        return {}


@dataclass
class StepResult:
    """What one committed step reports to the caller."""

    batch: StepBatch
    metrics: dict[str, float]
    record: TrainStep
    warnings: list[str] = field(default_factory=list)
    """What the step warned about (skipped empty groups, a collapsed policy); also in its manifest."""


def consumer_name(name: str) -> str:
    """The consumer id of trainer ``name`` (``train:<name>``)."""
    return name if name.startswith("train:") else f"train:{name}"


class Trainer:
    """Tails run ``run`` and trains ``backend`` on steps formed with ``options``."""

    def __init__(
        self,
        store: EventStore,
        run: str | Run,
        options: StepOptions,
        backend: Backend | None = None,
        *,
        consumer: str = "main",
        start_step: int = 0,
        reader: EventStore | None = None,
        replica_timeout_s: float = REPLAY_TIMEOUT_S,
        watch: CollapseWatch | None = None,
    ) -> None:
        self.store = store
        self.watch = watch if watch is not None else CollapseWatch()
        """Warns when the policy's entropy or gradient collapses (:mod:`dressage.training.health`)."""
        self.reader = reader
        """A read replica (:mod:`dressage.store.replica`) that groups and turns are read from, or None."""
        self.replica_timeout_s = replica_timeout_s
        self.start_step = start_step
        self.run = store.runs.get(run)
        self.options = options
        self.backend: Backend = backend or NullBackend()
        self.consumer = consumer_name(consumer)
        source = reader or store
        self.builder = StepBuilder(source, self.run, options)
        self.tail_warnings: list[str] = []
        """What the last :meth:`run_steps` warned about after its last step (groups skipped where
        no step could form); logged too."""
        self.tracker = GroupTracker(source, self.run, options.n_samples_per_prompt)
        self._pending: list[ReadyGroup] = []

    def _refresh(self, cursor: Cursor) -> None:
        if self.reader is not None:  # the replica first replays all the primary holds now
            wait_for_replay(self.store, self.reader, timeout_s=self.replica_timeout_s)
        self._pending += [g for g in self.tracker.poll() if g.cursor > cursor]

    @property
    def waiting_groups(self) -> list[ReadyGroup]:
        """Ready groups read from the log that no step has taken yet (fewer than a step needs, once
        ``run_steps`` ran dry): what ``train`` names as not trained."""
        return list(self._pending)

    def has_new_step(self) -> bool:
        """Whether the log now holds enough ready groups for the consumer's next step.

        Nothing is trained or committed: ``train`` asks this before it loads a model, so a rerun
        with nothing new answers at once.
        """
        ckpt = self.store.consumers.checkpoint(self.run, self.consumer)
        step = ckpt.step if ckpt else self.start_step
        cursor: Cursor = tuple(ckpt.state.get("cursor", START_CURSOR)) if ckpt else START_CURSOR
        self._refresh(cursor)  # the groups read stay pending: run_steps starts from the same cursor
        return self.builder.form(step + 1, self._pending, cursor, _frontier(ckpt)) is not None

    def run_steps(
        self,
        *,
        follow: bool = False,
        max_steps: int | None = None,
        poll_s: float = 0.5,
        throttle_s: float = 0.0,
        on_step: Callable[[StepResult], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[StepResult]:
        """Form, train and commit steps until the log runs dry (or forever with ``follow``).

        A consumer without a checkpoint numbers its first step ``start_step + 1`` (its weights were
        trained ``start_step`` steps elsewhere) and keeps ``start_step`` in its checkpoint state.
        A step that would train no token raises :class:`TrainingError` under ``empty_steps`` ``stop``
        (nothing of it is trained or committed).
        """
        ckpt = self.store.consumers.checkpoint(self.run, self.consumer)
        step = ckpt.step if ckpt else self.start_step
        start_step = int(ckpt.state.get("start_step", 0)) if ckpt else self.start_step
        cursor: Cursor = tuple(ckpt.state.get("cursor", START_CURSOR)) if ckpt else START_CURSOR
        frontier = _frontier(ckpt)
        self.backend.resume(self.run, ckpt)
        self.tail_warnings = []
        results: list[StepResult] = []
        while max_steps is None or len(results) < max_steps:
            if should_stop is not None and should_stop():
                break
            self._refresh(cursor)
            batch = self.builder.form(step + 1, self._pending, cursor, frontier)
            if batch is None:
                self._warn_unformed()
                if not follow:
                    break
                time.sleep(poll_s)
                continue
            if batch.n_trainable == 0:
                stopped = f"{self.consumer} of run {self.run.name!r} stopped after {step} committed step(s)"
                raise empty_step_error(batch, self.options, stopped)
            started = time.perf_counter()
            metrics = self.backend.train_step(batch)
            metrics = step_metrics(batch, metrics, time.perf_counter() - started)
            warnings = step_warnings(batch, metrics, self.watch)
            record = self.store.consumers.commit_step(
                self.run,
                self.consumer,
                step=batch.step,
                position=batch.position,
                batch_hash=batch.batch_hash,
                manifest={
                    **batch.manifest,
                    "backend": self.backend.name,
                    **({"warnings": warnings} if warnings else {}),
                },
                state={
                    "cursor": list(batch.cursor),
                    "trainer_version": batch.produced_version,
                    **({"start_step": start_step} if start_step else {}),
                    **({"data_version": batch.data_version} if batch.data_version is not None else {}),
                },
                start_step=start_step,
                metrics=metrics,
                decisions=step_decisions(batch),
            )
            self._pending = self._pending[batch.consumed :]
            cursor, step, frontier = batch.cursor, batch.step, batch.data_version
            result = StepResult(batch, metrics, record, warnings)
            results.append(result)
            if on_step is not None:
                on_step(result)
            if throttle_s:
                time.sleep(throttle_s)
        return results

    def _warn_unformed(self) -> None:
        """Log (once per change) the groups a skip consumed where no step could form."""
        warning = unformed_warning(self.builder.unformed_skips)
        if warning is not None and warning not in self.tail_warnings:
            log.warning("%s", warning)
            self.tail_warnings.append(warning)

    def replay(
        self, on_step: Callable[[StepBatch], None] | None = None, *, upto: int | None = None
    ) -> list[StepBatch]:
        """Re-form every recorded step of the consumer (or steps ``1..upto``) and check its batch hash.

        Raises :class:`ReplayDriftError` naming the step, and the first differing sample and field.
        The step's recorded batch metrics (:func:`~dressage.training.metrics.batch_metrics`: tokens,
        lengths, rewards, staleness) are recomputed and must be bitwise equal too, and so must its
        per-token decisions that the log decides (advantages, mask reasons:
        :func:`~dressage.training.decisions.decision_drift`).
        """
        recorded = self.store.consumers.steps(self.run, self.consumer)
        stored_metrics = self.store.consumers.metrics(self.run, self.consumer)
        stored_decisions = self.store.consumers.decisions(self.run, self.consumer)
        if upto is not None:
            recorded = [rec for rec in recorded if rec.step <= upto]
        cursor: Cursor = START_CURSOR
        frontier: int | None = None
        checked: list[StepBatch] = []
        for rec in recorded:
            self._refresh(cursor)
            batch = self.builder.form(rec.step, self._pending, cursor, frontier)
            if batch is None:
                raise ReplayDriftError(
                    f"{self.consumer} step {rec.step} of run {self.run.name!r}: the log no longer holds "
                    "enough ready groups to form it"
                )
            if batch.batch_hash != rec.batch_hash:
                detail = first_drift(rec.manifest.get("samples", []), batch.manifest["samples"])
                raise ReplayDriftError(
                    f"{self.consumer} step {rec.step} of run {self.run.name!r} drifted: {detail} "
                    f"(batch hash {rec.batch_hash[:12]} recorded, {batch.batch_hash[:12]} now)"
                )
            self._check_metrics(batch, stored_metrics.get(rec.step, {}))
            drift = decision_drift(stored_decisions.get(rec.step, []), batch)
            if drift is not None:
                raise ReplayDriftError(f"{self.consumer} step {rec.step} of run {self.run.name!r}: {drift}")
            self._pending = self._pending[batch.consumed :]
            cursor, frontier = batch.cursor, batch.data_version
            checked.append(batch)
            if on_step is not None:
                on_step(batch)
        return checked

    def _check_metrics(self, batch: StepBatch, stored: dict[str, float]) -> None:
        """Raise :class:`ReplayDriftError` when a recorded batch metric differs from its recomputation
        (steps committed before metrics were recorded have none and pass)."""
        for name, value in batch_metrics(batch).items():
            if name in stored and not same(stored[name], value):
                raise ReplayDriftError(
                    f"{self.consumer} step {batch.step} of run {self.run.name!r}: metric {name} was "
                    f"recorded as {stored[name]!r}, the replayed batch gives {value!r}"
                )


EMPTY_STEP_HINT = (
    "Train a recorded run with staleness measured against its own versions (--staleness-reference data, "
    "the default without --push-to), raise --max-staleness, or let such steps be skipped "
    "(--empty-steps skip; train.empty_steps in run.yaml)"
)


def empty_step_error(batch: StepBatch, options: StepOptions, stopped: str) -> TrainingError:
    """The one-line error of a step that would train 0 tokens under ``empty_steps`` ``stop`` (logged too)."""
    message = (
        f"{empty_step_reason(batch, options)}. Not trained or committed; {stopped} (empty_steps: stop). "
        + EMPTY_STEP_HINT
    )
    log.warning("%s", message)
    return TrainingError(message)


def _frontier(ckpt: ConsumerCheckpoint | None) -> int | None:
    """The data frontier a checkpoint keeps (staleness reference ``data``), None without one."""
    value = ckpt.state.get("data_version") if ckpt else None
    return int(value) if value is not None else None


def step_warnings(batch: StepBatch, metrics: dict[str, float], watch: CollapseWatch) -> list[str]:
    """The step's warnings (skipped empty groups, a collapsing policy), each logged as it is found."""
    skipped = skipped_warning(batch)
    warnings = ([skipped] if skipped else []) + watch.observe(batch.step, metrics)
    for w in warnings:
        log.warning("%s", w)
    return warnings


def step_metrics(batch: StepBatch, trainer: dict[str, float], seconds: float) -> dict[str, float]:
    """What a step records: the batch's metrics, the backend's, and (when the backend did work
    here, i.e. returned metrics) its duration and throughput. A backend that trains nothing in
    this process (none, slime's rollout side) gets no timing: it would time nothing."""
    out = {**batch_metrics(batch), **checked(trainer)}
    if trainer:
        out["step_time_s"] = seconds
        out["tokens_per_s"] = out["trained_tokens"] / seconds if seconds > 0 else 0.0
    return out


def manifest_summary(batch: StepBatch) -> dict[str, object]:
    """A few numbers of a step for progress displays."""
    m = batch.manifest
    return {
        "step": batch.step,
        "samples": m["n_samples"],
        "trajectories": m["n_trajectories"],
        "tokens": m["n_trainable_tokens"],
        "dropped": sum(1 for g in m["groups"] if not g["kept"]),
    }
