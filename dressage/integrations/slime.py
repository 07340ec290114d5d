"""Everything slime sees: rollout dumps for ``--load-debug-rollout-data`` and a live rollout function.

Checked against THUDM/slime commit ``624b824a898ab0ec1fcb4d373004c7f3852bf515``:

* ``slime.observability.rollout_data_utils.load_debug_rollout_data`` reads
  ``torch.load(path_template.format(rollout_id=k))["samples"]`` and rebuilds each with
  ``Sample.from_dict``; slime's rollout ids count from 0, so dressage step ``k`` is file ``k-1``.
* ``--rollout-function-path`` points at ``generate_rollout(args, rollout_id, data_source,
  evaluation=False)`` returning ``RolloutFnTrainOutput(samples=...)``; nested
  ``list[list[list[Sample]]]`` (prompt, trajectory, segments) is accepted when siblings share
  ``rollout_id`` (``validate_rollout_id_annotated``).
* ``--global-batch-size`` counts rollouts (trajectories), not samples (``build_dp_schedule``); one
  ``generate_rollout`` call returns ``--rollout-batch-size`` prompts x ``--n-samples-per-prompt``
  trajectories, which slime splits into optimizer steps of ``--global-batch-size``.
* slime calls the evaluation function with ``evaluation=True``, and ``--eval-function-path``
  defaults to ``--rollout-function-path``; with ``--debug-train-only`` it never evaluates.
* slime's reward post-processing normalises per group by reshaping rewards to
  ``[-1, n_samples_per_prompt]``, which is wrong once a trajectory has several segments. So
  dressage writes its own broadcast advantage into ``reward`` (the raw reward goes to
  ``metadata["raw_reward"]``, which slime logs) and the command line says
  ``--disable-rewards-normalization``.
* slime reads routed experts only when the first sample has them, then from every sample; a step
  where some sample lacks them is written without experts.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dressage.config import environment_values
from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training.samples import SLIME_COMMIT, TrainSample
from dressage.training.steps import StepBatch, StepOptions

__all__ = [
    "SLIME_COMMIT",
    "SlimeDumpBackend",
    "SlimeRolloutBackend",
    "generate_rollout",
    "rollout_options",
    "sample_to_slime_dict",
    "slime_command",
]


def sample_to_slime_dict(sample: TrainSample, *, with_experts: bool = True) -> dict[str, Any]:
    """A ``Sample.to_dict()``-shaped dict (every field of slime's ``Sample``), ``reward`` = advantage."""
    import torch

    versions = sorted({int(v) for v in sample.policy_versions if v >= 0})
    experts = None
    if with_experts and sample.rollout_routed_experts is not None:
        experts = torch.from_numpy(sample.rollout_routed_experts.astype("int32"))
    return {
        "group_index": sample.group_index,
        "index": sample.index,
        "rollout_id": sample.rollout_id,
        "prompt": "",
        "tokens": [int(x) for x in sample.tokens],
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {},
        "response": "",
        "response_length": int(sample.response_length),
        "label": None,
        "reward": float(sample.advantage),
        "loss_mask": [int(x) for x in sample.loss_mask],
        "weight_versions": [str(v) for v in versions],
        "rollout_log_probs": [float(x) for x in sample.rollout_log_probs],
        "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None,
        "rollout_routed_experts": experts,
        "remove_sample": False,
        "teacher_log_probs": None,
        "status": sample.status,
        "metadata": {
            "raw_reward": float(sample.reward),
            "dressage_session": sample.session_id,
            "dressage_segment": sample.segment_index,
            "dressage_anchor": sample.is_anchor,
        },
        "generate_function_path": None,
        "custom_rm_path": None,
        "train_metadata": None,
        "session_id": sample.session_id,
        "non_generation_time": 0.0,
        "spec_info": {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": 0,
        },
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }


def slime_dicts(samples: Sequence[TrainSample]) -> list[dict[str, Any]]:
    """The step's samples as slime dicts, experts kept only when every sample has them."""
    with_experts = all(s.rollout_routed_experts is not None for s in samples)
    return [sample_to_slime_dict(s, with_experts=with_experts) for s in samples]


def slime_command(pattern: str, options: StepOptions, n_steps: int | None = None) -> str:
    """The slime arguments that train on dumped files matching ``pattern`` (``.../{rollout_id}.pt``)."""
    n = options.n_samples_per_prompt
    args = [
        "--load-debug-rollout-data",
        pattern,
        "--debug-train-only",
        "--rollout-batch-size",
        str(options.global_batch_size // n),
        "--n-samples-per-prompt",
        str(n),
        "--global-batch-size",
        str(options.global_batch_size),
        "--disable-rewards-normalization",
        "--advantage-estimator",
        "grpo",
    ]
    if n_steps is not None:
        args += ["--num-rollout", str(n_steps)]
    return "python train.py " + " ".join(shlex.quote(a) for a in args) + "  # plus your model/parallel args"


class SlimeDumpBackend:
    """Writes each step as slime rollout file ``{out_dir}/{step - 1}.pt`` (no training here)."""

    name = "slime-dump"

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)

    @property
    def pattern(self) -> str:
        """The ``--load-debug-rollout-data`` template."""
        return str(self.out_dir / "{rollout_id}.pt")

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Make the output directory; files of committed steps stay as they are."""
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """Write the step's file atomically (temp file + rename) before the log commit."""
        import torch

        rollout_id = batch.step - 1
        path = Path(self.pattern.format(rollout_id=rollout_id))
        tmp = path.with_suffix(".tmp")
        torch.save({"rollout_id": rollout_id, "samples": slime_dicts(batch.samples)}, tmp)
        tmp.replace(path)
        return {"samples": float(len(batch.samples))}


class SlimeRolloutBackend:
    """The backend recorded for steps handed to slime by :func:`generate_rollout` (slime trains them)."""

    name = "slime"

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Nothing to restore: slime keeps its own model and optimizer checkpoints."""

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """Nothing to do before the commit: slime trains on the returned samples afterwards."""
        return {}


def _setting(args: Any, attr: str, env: str) -> str | None:
    return getattr(args, attr, None) or environment_values([env])[env]


def rollout_options(args: Any) -> StepOptions:
    """The step options of one slime rollout, from slime's arguments.

    One slime rollout (one ``generate_rollout`` call, one dressage step) holds
    ``rollout_batch_size`` groups of ``n_samples_per_prompt`` trajectories (without
    ``rollout_batch_size``: ``global_batch_size`` trajectories); slime splits it into its own
    optimizer steps of ``global_batch_size`` trajectories. ``grpo_std_normalization`` becomes the
    dressage advantage's std normalisation (dressage divides by the group's population std,
    ``ddof=0``; slime's own normalisation uses the sample std). slime's own reward normalisation must be off
    (``--disable-rewards-normalization``): dressage writes the broadcast advantage into
    ``Sample.reward`` and slime would normalise it again over ``[-1, n_samples_per_prompt]``, which
    is wrong once a trajectory has several segments.
    """
    if getattr(args, "rewards_normalization", False):
        raise ConfigError(
            "slime's reward normalisation is on; pass --disable-rewards-normalization (dressage already "
            "writes the per-group advantage, broadcast to every segment, into Sample.reward)"
        )
    n = getattr(args, "n_samples_per_prompt", None)
    prompts = getattr(args, "rollout_batch_size", None)
    if n is None or (prompts is None and getattr(args, "global_batch_size", None) is None):
        raise ConfigError(
            "generate_rollout needs slime's args.n_samples_per_prompt and args.rollout_batch_size "
            "(or args.global_batch_size); call it from slime or pass an args namespace that has them"
        )
    trajectories = int(prompts) * int(n) if prompts is not None else int(args.global_batch_size)
    return StepOptions(
        global_batch_size=trajectories,
        n_samples_per_prompt=int(n),
        std_normalize=bool(getattr(args, "grpo_std_normalization", False)),
    )


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime rollout function: step ``rollout_id + 1`` of consumer ``train:slime`` from the log.

    For ``--rollout-function-path dressage.integrations.slime.generate_rollout`` with
    ``--debug-train-only`` (no SGLang engines: the samples come from the log, ``data_source`` is not
    read). Run and database come from ``args.dressage_run`` / ``args.dressage_database_url`` or the
    environment (``DRESSAGE_RUN``, ``DRESSAGE_DATABASE_URL``); the consumer name from
    ``args.dressage_consumer`` or ``DRESSAGE_CONSUMER`` (default ``slime``). Step size: see
    :func:`rollout_options`.

    * The next uncommitted step (``rollout_id`` = the consumer's committed step count): formed,
      waiting (polling the log) until enough groups are ready, and committed with the consumer
      checkpoint before it is returned; slime trains on it afterwards.
    * An already committed step (slime restarted from a checkpoint older than the log's consumer
      checkpoint): re-formed and checked against its recorded batch hash, not committed again.
    * A step beyond the next one: :class:`TrainingError` (slime and the log disagree).

    Returns ``RolloutFnTrainOutput(samples=[[[Sample, ...] per trajectory] per group],
    metrics={...})``: segments of one trajectory share ``rollout_id``, ``reward`` is the broadcast
    advantage. ``evaluation=True`` raises :class:`NotSupportedError`: evaluation needs a policy to
    sample from, which the log does not have.
    """
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput
        from slime.utils.types import Sample
    except ImportError as e:
        raise NotSupportedError(
            "dressage.integrations.slime:generate_rollout runs inside slime, which is not importable "
            f"here ({e}); install slime (THUDM/slime) or use `dressage-worker train --backend slime-dump`"
        ) from e
    if evaluation:
        raise NotSupportedError(
            "evaluation rollouts cannot come from the dressage log (they sample the current policy); "
            "slime uses --rollout-function-path for evaluation too unless --eval-function-path is set: "
            "set --eval-function-path slime.rollout.sglang_rollout.generate_rollout, or drop "
            "--eval-interval"
        )
    from dressage.store.event_store import EventStore
    from dressage.training.consumer import Trainer

    run = _setting(args, "dressage_run", "DRESSAGE_RUN")
    if not run:
        raise ConfigError("set DRESSAGE_RUN (or args.dressage_run) to the run slime should train on")
    options = rollout_options(args)
    consumer = _setting(args, "dressage_consumer", "DRESSAGE_CONSUMER") or "slime"
    store = EventStore.open(_setting(args, "dressage_database_url", "DRESSAGE_DATABASE_URL"))
    try:
        trainer = Trainer(store, run, options, SlimeRolloutBackend(), consumer=consumer)
        step = rollout_id + 1
        ckpt = store.get_checkpoint(run, trainer.consumer)
        committed = ckpt.step if ckpt else 0
        if step <= committed:
            batch = trainer.replay(upto=step)[-1]
        elif step == committed + 1:
            batch = trainer.run_steps(follow=True, max_steps=1)[0].batch
        else:
            raise TrainingError(
                f"slime asks for rollout {rollout_id} (step {step}) but {trainer.consumer} of run {run!r} "
                f"has committed only {committed} steps; resume slime from a checkpoint at or before "
                f"rollout {committed}, or point it at the consumer that trained those steps"
            )
    finally:
        store.close()
    groups: dict[int, dict[int, list[Any]]] = {}
    for d in slime_dicts(batch.samples):
        groups.setdefault(d["group_index"], {}).setdefault(d["rollout_id"], []).append(Sample.from_dict(d))
    nested = [list(trajs.values()) for trajs in groups.values()]
    metrics = {
        "dressage/step": batch.step,
        "dressage/samples": batch.manifest["n_samples"],
        "dressage/trajectories": batch.manifest["n_trajectories"],
        "dressage/trainable_tokens": batch.manifest["n_trainable_tokens"],
    }
    return RolloutFnTrainOutput(samples=nested, metrics=metrics)
