"""Forming optimizer steps from ready groups: policy decisions, advantages, weights, manifest.

A step takes ready groups in consumption order (``(ready_position, task_index)``) until it holds
``global_batch_size / n_samples_per_prompt`` kept groups; groups dropped on the way (failed
members under ``drop_group``, outside the version window, malformed) are consumed too and listed
in the step's manifest with their reason. Samples are ordered by group, then sample index, then
segment order.

A step whose kept groups would train no token at all (every response token masked) is never
trained silently: with ``empty_steps`` ``stop`` (the default) the trainer refuses to commit it
and says why; with ``skip`` its groups are consumed as dropped (reason ``no_trainable_tokens``,
listed in the manifest of the step formed after them) and the step is formed from the groups
that follow.

Everything here is a pure function of the log, the step number, the options and the data
frontier carried from step to step, which is what makes resume and replay byte-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dressage.errors import ConfigError, TrainingError
from dressage.store.event_store import EventStore
from dressage.store.records import Run
from dressage.training.advantages import assign_advantages, get_estimator
from dressage.training.groups import Cursor, ReadyGroup
from dressage.training.manifest import batch_hash, field_digests, sample_entries
from dressage.training.masking import MaskingPolicy, apply_version_mask, group_outside_window, reason_counts
from dressage.training.materialize import Trajectory, materialize_trajectory
from dressage.training.samples import TrainSample
from dressage.training.trees import apply_tree, build_tree, tree_rollout_ids, tree_sessions
from dressage.training.turn_prefetch import TurnPrefetcher, finished_sessions
from dressage.training.weights import assign_loss_weights

EMPTY_STEPS = ("stop", "skip")
"""What a trainer does with a step that would train no token (see the module docstring)."""
NO_TRAINABLE_TOKENS = "no_trainable_tokens"
"""The manifest's reason for the groups of a skipped empty step."""


@dataclass(frozen=True)
class StepOptions:
    """What shapes a step (recorded in every manifest)."""

    global_batch_size: int = 8
    n_samples_per_prompt: int = 4
    advantage_estimator: str = "grpo"
    std_normalize: bool = False
    eps: float = 1e-6
    initial_version: int = 0
    masking: MaskingPolicy = field(default_factory=MaskingPolicy)
    empty_steps: str = "stop"

    def __post_init__(self) -> None:
        if self.empty_steps not in EMPTY_STEPS:
            raise ConfigError(f"empty_steps must be one of {EMPTY_STEPS}, got {self.empty_steps!r}")
        n, gbs = self.n_samples_per_prompt, self.global_batch_size
        if n < 1 or gbs < 1 or gbs % n:
            raise ConfigError(
                f"global batch size {gbs} must be a positive multiple of n_samples_per_prompt {n} "
                "(a step holds whole groups)"
            )
        get_estimator(self.advantage_estimator)

    @property
    def groups_per_step(self) -> int:
        """Kept groups (prompts) per optimizer step."""
        return self.global_batch_size // self.n_samples_per_prompt

    def as_dict(self) -> dict[str, Any]:
        """For the manifest."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepOptions:
        """Rebuild the options a manifest recorded (replay uses the recorded ones)."""
        data = dict(data)
        # steps recorded before staleness_reference existed measured staleness against the trainer
        masking = MaskingPolicy(**{"staleness_reference": "trainer", **data.pop("masking", {})})
        return cls(**data, masking=masking)


@dataclass
class StepBatch:
    """One optimizer step's samples and its manifest."""

    step: int
    trainer_version: int
    samples: list[TrainSample]
    consumed: int  # how many pending groups (kept + dropped) the step used
    cursor: Cursor
    position: int
    manifest: dict[str, Any]
    batch_hash: str
    data_version: int | None = None
    """The data frontier after this step: the newest policy version of every group consumed so far
    (with ``staleness_reference`` ``data``; None otherwise). A trainer keeps it with its cursor."""

    @property
    def n_trainable(self) -> int:
        """Tokens the step trains (loss mask 1)."""
        return int(self.manifest["n_trainable_tokens"])

    @property
    def skipped_groups(self) -> list[dict[str, Any]]:
        """The manifest decisions of the groups consumed as an empty step's (``empty_steps`` ``skip``)."""
        return [g for g in self.manifest["groups"] if g.get("reason") == NO_TRAINABLE_TOKENS]

    @property
    def produced_version(self) -> int:
        """The policy version this step's update produces (the weights it trains are ``trainer_version``).

        The one place the trainer side turns the version it trains into the version it pushes.
        """
        return self.trainer_version + 1


def rollout_id_of(group_index: int, sample_index: int, n_samples_per_prompt: int) -> int:
    """The integer id shared by every segment of one trajectory: ``group * n + sample``."""
    return group_index * n_samples_per_prompt + sample_index


@dataclass
class StepFill:
    """The groups taken for one step, in consumption order: the kept groups' samples (with an
    origin each, e.g. their run), every group's decision, and the data frontier.

    When the step is full and its samples would train no token, ``empty_steps`` ``skip`` turns its
    kept groups into dropped ones (:data:`NO_TRAINABLE_TOKENS`, with their mask reason counts) and
    the step goes on filling from the groups after them.
    """

    groups_per_step: int
    empty_steps: str
    frontier: int | None = None
    samples: list[TrainSample] = field(default_factory=list)
    origins: list[Any] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    consumed: int = 0
    _kept: list[int] = field(default_factory=list)

    @property
    def full(self) -> bool:
        """Whether the step holds its kept groups."""
        return len(self._kept) == self.groups_per_step

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The decisions of the groups consumed as an empty step's so far."""
        return [d for d in self.decisions if d.get("reason") == NO_TRAINABLE_TOKENS]

    def take(self, decision: dict[str, Any], samples: list[TrainSample], origin: Any = None) -> None:
        """Consume one group (kept or dropped) with its decision and samples."""
        self.consumed += 1
        self.decisions.append(decision)
        if "staleness_reference" in decision:
            self.frontier = int(decision["staleness_reference"])
        if not decision["kept"]:
            return
        self._kept.append(len(self.decisions) - 1)
        self.samples += samples
        self.origins += [origin] * len(samples)
        if self.full and self.empty_steps == "skip" and not any(s.n_trainable for s in self.samples):
            masked = reason_counts(self.samples)
            for i in self._kept:
                self.decisions[i] = {**self.decisions[i], "kept": False, "reason": NO_TRAINABLE_TOKENS}
                self.decisions[i]["mask_reasons"] = masked
            self.samples, self.origins, self._kept = [], [], []


class StepBuilder:
    """Materializes groups and assembles :class:`StepBatch` es."""

    def __init__(self, store: EventStore, run: Run, options: StepOptions) -> None:
        self.store = store
        self.run = run
        self.options = options
        self.prefetch = TurnPrefetcher(store)
        self.unformed_skips: list[dict[str, Any]] = []
        """Groups the last :meth:`form` that found too few groups had skipped as an empty step's
        (``empty_steps`` ``skip``): they train nothing, and no step lists them until one forms."""

    def trainer_version(self, step: int) -> int:
        """Version of the weights step ``step`` updates: ``initial_version + step - 1``."""
        return self.options.initial_version + step - 1

    def materialize_group(
        self,
        group: ReadyGroup,
        trainer_version: int,
        turns_by_session: dict[str, list[Any]] | None = None,
        frontier: int | None = None,
    ) -> tuple[list[TrainSample], dict[str, Any]]:
        """The group's samples (empty when dropped) and its manifest decision.

        ``turns_by_session`` (prefetched by :meth:`form`, one query for a whole step) must hold every
        finished member's turns when given; otherwise the group's turns are read here. ``frontier``:
        the data frontier before this group (staleness reference ``data``); the decision then
        records the version the group was measured against as ``staleness_reference``.
        """
        opts, policy = self.options, self.options.masking
        self._refuse_null_rewards(group)
        members = [
            {"sample": m.sample_index, "session": m.session_id, "status": m.status, "reward": m.reward}
            for m in group.members
        ]
        decision: dict[str, Any] = {"task_index": group.task_index, "ready_position": group.ready_position}
        decision["members"] = members
        unfinished = [m for m in group.members if m.status != "finished"]
        if unfinished and policy.failure_policy == "drop_group":
            return [], {**decision, "kept": False, "reason": "member_not_finished"}
        kept = [m for m in group.members if m.status == "finished"]
        if not kept:
            return [], {**decision, "kept": False, "reason": "no_finished_member"}
        if group.forks:
            return self._materialize_tree(group, (trainer_version, frontier), turns_by_session, decision)
        by_session = turns_by_session
        if by_session is None or any(m.session_id not in by_session for m in kept if m.session_id):
            by_session = self._read([m.session_id for m in kept if m.session_id])
        samples: list[TrainSample] = []
        try:
            for m in kept:
                assert m.session_id is not None and m.reward is not None
                rid = rollout_id_of(group.group_index, m.sample_index, opts.n_samples_per_prompt)
                traj = Trajectory(m.session_id, float(m.reward), "completed", rid, group.group_index, rid)
                samples += materialize_trajectory(by_session.get(m.session_id, []), traj)
        except TrainingError as e:
            return [], {**decision, "kept": False, "reason": "invalid", "error": str(e)}
        dropped = self._version_window(samples, (trainer_version, frontier), decision)
        if dropped is not None:
            return [], dropped
        adv = assign_advantages(
            samples, opts.advantage_estimator, std_normalize=opts.std_normalize, eps=opts.eps
        )
        decision["advantages"] = {str(k): v for k, v in adv.items()}
        if unfinished:
            decision["dropped_members"] = [m.sample_index for m in unfinished]
        return samples, {**decision, "kept": True}

    def _refuse_null_rewards(self, group: ReadyGroup) -> None:
        """A finished session with a NULL reward (its task's rewards kept whole, none of them chosen to
        train, e.g. a multi-key Harbor ``reward.json`` in a run without ``reward.key``) stops training
        with a :class:`TrainingError` saying why, before its group is consumed: it is never dropped
        nor read as 0, so no data is lost."""
        ids = [m.session_id for m in group.members if m.status == "finished" and m.reward is None]
        ids += [f.session_id for f in group.forks if f.status == "finished" and f.reward is None]
        if not ids or ids[0] is None:
            return
        why = self.store.sessions.get(ids[0]).info.get("no_scalar_reward") or "no reason was recorded"
        raise TrainingError(
            f"run {self.run.name!r}: session {ids[0]} (group {group.group_index}) finished without a "
            f"scalar reward: {why}. Training refuses NULL rewards (a session is never dropped or read "
            "as 0): give the run a reward.key or reward.weights that picks one number; the session, "
            "its turns and every reward it wrote stay in the log, and nothing was consumed"
        )

    def _materialize_tree(
        self,
        group: ReadyGroup,
        versions: tuple[int, int | None],
        turns_by_session: dict[str, list[Any]] | None,
        decision: dict[str, Any],
    ) -> tuple[list[TrainSample], dict[str, Any]]:
        """A group with forks: every finished session of its trees, tree advantages, shared tokens once."""
        opts, policy = self.options, self.options.masking
        if opts.advantage_estimator != "tree":
            raise ConfigError(
                f"run {self.run.name!r}: group {group.group_index} holds forked sessions (a tree); train it "
                f"with advantage estimator 'tree', not {opts.advantage_estimator!r} (docs/trees.md)"
            )
        decision["forks"] = [
            {"session": f.session_id, "parent": f.parent_session_id, "fork_turn": f.fork_turn,
             "status": f.status, "reward": f.reward}
            for f in group.forks
        ]  # fmt: skip
        if policy.failure_policy == "drop_group" and any(f.status != "finished" for f in group.forks):
            return [], {**decision, "kept": False, "reason": "branch_not_finished"}
        rids = tree_rollout_ids(group, opts.n_samples_per_prompt)
        sessions = tree_sessions(group)
        finished = [x for x in sessions if x.finished]
        by_session = turns_by_session
        if by_session is None or any(x.session_id not in by_session for x in finished):
            by_session = self._read([x.session_id for x in finished])
        samples: list[TrainSample] = []
        try:
            for x in finished:
                rid = rids[x.session_id]
                traj = Trajectory(
                    x.session_id, float(x.reward or 0.0), "completed", rid, group.group_index, rid
                )
                samples += materialize_trajectory(by_session.get(x.session_id, []), traj)
            sized = [replace(x, n_turns=len(by_session.get(x.session_id, []))) for x in sessions]
            tree = build_tree(sized, std_normalize=opts.std_normalize, eps=opts.eps)
        except TrainingError as e:
            return [], {**decision, "kept": False, "reason": "invalid", "error": str(e)}
        dropped = self._version_window(samples, versions, decision)
        if dropped is not None:
            return [], dropped
        apply_tree(tree, samples, by_session)
        decision["advantages"] = {str(s.rollout_id): s.advantage for s in samples if s.is_anchor}
        decision["tree"] = tree.describe()
        return samples, {**decision, "kept": True}

    def _version_window(
        self, samples: list[TrainSample], versions: tuple[int, int | None], decision: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Drop decision when the group is outside the version window; else mask its samples' versions.

        ``versions``: the trainer's version and the data frontier before the group, from which the
        reference the group is measured against comes (:meth:`MaskingPolicy.reference_version`;
        recorded in ``decision`` under ``data``). Returns the manifest decision for a dropped group,
        or ``None`` after :func:`apply_version_mask` has been applied to every sample (both flat and
        tree groups).
        """
        policy = self.options.masking
        reference = policy.reference_version(samples, *versions)
        if policy.staleness_reference == "data":
            decision["staleness_reference"] = reference
        oldest = group_outside_window(samples, policy, reference)
        if oldest is not None:
            return {
                **decision,
                "kept": False,
                "reason": "outside_version_window",
                "oldest_version": oldest,
            }
        for s in samples:
            apply_version_mask(s, policy, reference)
        return None

    def _read(self, session_ids: list[str]) -> dict[str, list[Any]]:
        return dict(self.prefetch.turns(session_ids)) if session_ids else {}

    def form(
        self, step: int, pending: Sequence[ReadyGroup], cursor: Cursor, frontier: int | None = None
    ) -> StepBatch | None:
        """Step ``step`` from the front of ``pending``; None until enough groups are ready.

        ``frontier``: the data frontier after the previous step (:attr:`StepBatch.data_version`).
        The turns of the first ``groups_per_step`` pending groups are read ahead a few groups per
        query (:class:`TurnPrefetcher`) while earlier groups are materialized; groups needed beyond
        them are read one by one. Before hashing, the next step's groups are asked for.
        """
        version = self.trainer_version(step)
        ahead = pending[: self.options.groups_per_step]
        if len(ahead) < self.options.groups_per_step:
            ahead = []  # not enough groups yet: nothing worth reading ahead
        self.prefetch.want(ahead)
        fill = StepFill(self.options.groups_per_step, self.options.empty_steps, frontier)
        for group in pending:
            if fill.full:
                break
            group_samples, decision = self.materialize_group(
                group, version, self._read(finished_sessions([group])) if ahead else None, fill.frontier
            )
            fill.take(decision, group_samples)
        self.unformed_skips = [] if fill.full else fill.skipped
        if not fill.full:
            return None
        samples, decisions, consumed = fill.samples, fill.decisions, fill.consumed
        self.prefetch.want(pending[consumed : consumed + self.options.groups_per_step])
        assign_loss_weights(samples)
        last = pending[consumed - 1]
        digests = [field_digests(s) for s in samples]
        digest = batch_hash(samples, digests)
        manifest = {
            "step": step,
            "trainer_version": version,
            "cursor_from": list(cursor),
            "cursor_to": list(last.cursor),
            "options": self.options.as_dict(),
            "groups": decisions,
            "n_samples": len(samples),
            "n_trajectories": len({s.rollout_id for s in samples}),
            "n_trainable_tokens": sum(s.n_trainable for s in samples),
            "samples": sample_entries(samples, digests),
        }
        return StepBatch(
            step,
            version,
            samples,
            consumed,
            last.cursor,
            last.ready_position,
            manifest,
            digest,
            fill.frontier,
        )
