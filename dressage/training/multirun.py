"""Training one consumer on several runs: ``train --from-run A --from-run B ...``.

Each run keeps its own group tracker and step builder (groups, advantages and the version mask
are decided per run, exactly as for one run); a step takes ready groups from every run in one
merged, deterministic order: ``(ready_position, run order, task_index)``. Every sample keeps its
run's recorded behaviour logprobs (``rollout_log_probs``), which the torch backend's truncated
importance sampling divides by (``min(exp(old - behaviour), tis_cap)``), so data from an earlier
run is reweighted towards the current policy like any stale sample.

Staleness across runs: policy versions are numbered per run. ``version_offsets[i]`` places run
``i``'s versions on the trainer's scale (a token of version ``v`` in run ``i`` counts as version
``v + offset``); the masking policy (``max_staleness``, ``group_version_window``) then applies to
every run alike. The default offset 0 fits runs that continue one lineage of weights. With
``staleness_reference`` ``data`` (offline, the default of ``train`` without ``--push-to``) the
reference is the newest shifted version of the data consumed so far, over all runs.

Steps are recorded in the first run (the consumer's home) with the other runs named in the
manifest (``runs``, ``version_offsets``) and each sample's and group's ``run``; the batch hash
covers the samples' run of origin, so ``replay`` re-forms every step bitwise from the same runs.
Rollout ids of run ``i`` are shifted by ``i * ROLLOUT_ID_STRIDE`` so trajectories of different runs
never share one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dressage.errors import ConfigError, ReplayDriftError
from dressage.store.event_store import EventStore
from dressage.store.records import Run
from dressage.training.consumer import (
    Backend,
    NullBackend,
    consumer_name,
    empty_step_error,
    step_metrics,
    step_warnings,
)
from dressage.training.decisions import step_decisions
from dressage.training.groups import START_CURSOR, Cursor, GroupTracker, ReadyGroup
from dressage.training.health import CollapseWatch
from dressage.training.manifest import batch_hash, field_digests, first_drift, sample_entries
from dressage.training.steps import StepBatch, StepBuilder, StepFill, StepOptions
from dressage.training.weights import assign_loss_weights

ROLLOUT_ID_STRIDE = 1 << 32
"""Rollout ids (and slime indexes) of the ``i``-th run are shifted by ``i`` times this."""


@dataclass(frozen=True)
class Pending:
    """A ready group of one of the runs, in the merged consumption order."""

    run_index: int
    group: ReadyGroup

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.group.ready_position, self.run_index, self.group.task_index)


class MultiRunTrainer:
    """Forms, trains and records steps over the ready groups of several runs."""

    def __init__(
        self,
        store: EventStore,
        runs: Sequence[str | Run],
        options: StepOptions,
        backend: Backend | None = None,
        *,
        consumer: str = "main",
        version_offsets: Sequence[int] | None = None,
        watch: CollapseWatch | None = None,
    ) -> None:
        if not runs:
            raise ConfigError("train needs at least one --from-run")
        self.store = store
        self.runs = [store.runs.get(r) for r in runs]
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ConfigError(f"--from-run names a run twice: {names}")
        self.offsets = list(version_offsets or [0] * len(self.runs))
        if len(self.offsets) != len(self.runs):
            raise ConfigError(f"{len(self.offsets)} version offsets for {len(self.runs)} runs")
        self.options = options
        self.backend: Backend = backend or NullBackend()
        self.consumer = consumer_name(consumer)
        self.builders = [StepBuilder(store, r, options) for r in self.runs]
        self.trackers = [GroupTracker(store, r, options.n_samples_per_prompt) for r in self.runs]
        self._pending: list[Pending] = []
        self.watch = watch if watch is not None else CollapseWatch()
        self.warnings: dict[int, list[str]] = {}
        """Each new step's warnings (also in its manifest), by step."""

    @property
    def home(self) -> Run:
        """The run whose ``train_steps`` hold this consumer's steps (the first ``--from-run``)."""
        return self.runs[0]

    def _refresh(self, cursors: list[Cursor]) -> None:
        for i, tracker in enumerate(self.trackers):
            self._pending += [Pending(i, g) for g in tracker.poll() if g.cursor > cursors[i]]
        self._pending.sort(key=lambda p: p.order)

    def form(
        self, step: int, cursors: list[Cursor], frontier: int | None = None
    ) -> tuple[StepBatch, list[Cursor]] | None:
        """Step ``step`` from the front of the merged pending groups; None until enough are ready.

        ``frontier``: the data frontier after the previous step, on the trainer's scale.
        """
        version = self.options.initial_version + step - 1
        fill = StepFill(self.options.groups_per_step, self.options.empty_steps, frontier)
        new_cursors = list(cursors)
        for p in self._pending:
            if fill.full:
                break
            run, offset = self.runs[p.run_index], self.offsets[p.run_index]
            # the version mask compares token versions with the trainer's: shift the trainer's
            # version (and the data frontier) into the run's numbering instead of every token
            group_samples, decision = self.builders[p.run_index].materialize_group(
                p.group, version - offset, None, None if fill.frontier is None else fill.frontier - offset
            )
            if "staleness_reference" in decision:  # recorded on the trainer's scale
                decision["staleness_reference"] += offset
            new_cursors[p.run_index] = p.group.cursor
            for s in group_samples:
                s.rollout_id += p.run_index * ROLLOUT_ID_STRIDE
                s.index += p.run_index * ROLLOUT_ID_STRIDE
            fill.take({"run": run.name, **decision}, group_samples, run.name)
        if not fill.full:
            return None
        samples, origins, decisions, consumed = fill.samples, fill.origins, fill.decisions, fill.consumed
        assign_loss_weights(samples)
        digests = [field_digests(s) for s in samples]
        h = hashlib.sha256(batch_hash(samples, digests).encode())
        for name in origins:
            h.update(b"\x1f" + name.encode())
        entries = [
            {"run": name, **e} for name, e in zip(origins, sample_entries(samples, digests), strict=True)
        ]
        last = self._pending[consumed - 1].group
        manifest = {
            "step": step,
            "trainer_version": version,
            "runs": [r.name for r in self.runs],
            "version_offsets": self.offsets,
            "cursors_from": [list(c) for c in cursors],
            "cursors_to": [list(c) for c in new_cursors],
            "options": self.options.as_dict(),
            "groups": decisions,
            "n_samples": len(samples),
            "n_trajectories": len({s.rollout_id for s in samples}),
            "n_trainable_tokens": sum(s.n_trainable for s in samples),
            "samples": entries,
        }
        batch = StepBatch(
            step,
            version,
            samples,
            consumed,
            last.cursor,
            last.ready_position,
            manifest,
            h.hexdigest(),
            fill.frontier,
        )
        return batch, new_cursors

    def _checkpoint(self) -> tuple[int, list[Cursor], int | None]:
        ckpt = self.store.consumers.checkpoint(self.home, self.consumer)
        if ckpt is None:
            return 0, [START_CURSOR] * len(self.runs), None
        recorded = ckpt.state.get("runs")
        if recorded != [r.name for r in self.runs]:
            raise ConfigError(
                f"{self.consumer} of run {self.home.name!r} was trained on runs {recorded}; "
                f"continue it with the same --from-run list, in the same order"
            )
        frontier = ckpt.state.get("data_version")
        return (
            ckpt.step,
            [(int(c[0]), int(c[1])) for c in ckpt.state["cursors"]],
            int(frontier) if frontier is not None else None,
        )

    def run_steps(
        self, *, max_steps: int | None = None, should_stop: Callable[[], bool] | None = None
    ) -> list[StepBatch]:
        """Form, train and commit steps until no run has enough ready groups left (or ``should_stop``
        says so between steps); a step that would train no token raises :class:`TrainingError` under
        ``empty_steps`` ``stop``."""
        step, cursors, frontier = self._checkpoint()
        self.backend.resume(self.home, self.store.consumers.checkpoint(self.home, self.consumer))
        done: list[StepBatch] = []
        while max_steps is None or len(done) < max_steps:
            if should_stop is not None and should_stop():
                break
            self._refresh(cursors)
            formed = self.form(step + 1, cursors, frontier)
            if formed is None:
                break
            batch, new_cursors = formed
            if batch.n_trainable == 0:
                raise empty_step_error(
                    batch, self.options, f"{self.consumer} stopped after {step} committed step(s)"
                )
            cursors = new_cursors
            started = time.perf_counter()
            metrics = step_metrics(batch, self.backend.train_step(batch), time.perf_counter() - started)
            warnings = self.warnings[batch.step] = step_warnings(batch, metrics, self.watch)
            self.store.consumers.commit_step(
                self.home,
                self.consumer,
                step=batch.step,
                position=self.store.events.last_position(self.home),
                batch_hash=batch.batch_hash,
                manifest={
                    **batch.manifest,
                    "backend": self.backend.name,
                    **({"warnings": warnings} if warnings else {}),
                },
                state={
                    "runs": [r.name for r in self.runs],
                    "cursors": [list(c) for c in cursors],
                    "trainer_version": batch.produced_version,
                    **({"data_version": batch.data_version} if batch.data_version is not None else {}),
                },
                metrics=metrics,
                decisions=step_decisions(batch),
            )
            self._pending = self._pending[batch.consumed :]
            step, frontier = batch.step, batch.data_version
            done.append(batch)
        return done

    def replay(self) -> list[StepBatch]:
        """Re-form every recorded step from the same runs and check each batch hash."""
        cursors = [START_CURSOR] * len(self.runs)
        frontier: int | None = None
        checked: list[StepBatch] = []
        for rec in self.store.consumers.steps(self.home, self.consumer):
            self._refresh(cursors)
            formed = self.form(rec.step, cursors, frontier)
            if formed is None:
                raise ReplayDriftError(
                    f"{self.consumer} step {rec.step} of runs {[r.name for r in self.runs]}: the logs no "
                    "longer hold enough ready groups to form it"
                )
            batch, cursors = formed
            if batch.batch_hash != rec.batch_hash:
                detail = first_drift(rec.manifest.get("samples", []), batch.manifest["samples"])
                raise ReplayDriftError(
                    f"{self.consumer} step {rec.step} drifted: {detail} "
                    f"(batch hash {rec.batch_hash[:12]} recorded, {batch.batch_hash[:12]} now)"
                )
            self._pending = self._pending[batch.consumed :]
            frontier = batch.data_version
            checked.append(batch)
        return checked
