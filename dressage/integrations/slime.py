"""Everything slime sees: rollout dumps for ``--load-debug-rollout-data`` and a live rollout function.

Checked against THUDM/slime commit ``624b824a898ab0ec1fcb4d373004c7f3852bf515``:

* ``slime.observability.rollout_data_utils.load_debug_rollout_data`` reads
  ``torch.load(path_template.format(rollout_id=k))["samples"]`` and rebuilds each with
  ``Sample.from_dict``; slime's rollout ids count from 0, so dressage step ``k`` is file ``k-1``.
* ``--rollout-function-path`` points at ``generate_rollout(args, rollout_id, data_source,
  evaluation=False)`` returning ``RolloutFnTrainOutput(samples=...)``; nested
  ``list[list[list[Sample]]]`` (prompt, trajectory, segments) is accepted when siblings share
  ``rollout_id`` (``validate_rollout_id_annotated``).
* ``--global-batch-size`` counts rollouts (trajectories), not samples (``build_dp_schedule``).
* slime's reward post-processing normalises per group by reshaping rewards to
  ``[-1, n_samples_per_prompt]``, which is wrong once a trajectory has several segments. So
  dressage writes its own broadcast advantage into ``reward`` (the raw reward goes to
  ``metadata["raw_reward"]``, which slime logs) and the command line says
  ``--disable-rewards-normalization``.
* slime reads routed experts only when the first sample has them, then from every sample; a step
  where some sample lacks them is written without experts.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training.samples import SLIME_COMMIT, TrainSample
from dressage.training.steps import StepBatch, StepOptions

__all__ = [
    "SLIME_COMMIT",
    "SlimeDumpBackend",
    "generate_rollout",
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


def _setting(args: Any, attr: str, env: str) -> str | None:
    return getattr(args, attr, None) or os.environ.get(env)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime rollout function: step ``rollout_id + 1`` of consumer ``train:slime`` from the log.

    Reads run and database from ``args.dressage_run`` / ``args.dressage_database_url`` or the
    environment (``DRESSAGE_RUN``, ``DRESSAGE_DATABASE_URL``); blocks until enough groups are
    ready. A step that was already committed (slime restarted) is re-formed and hash-checked.
    Returns ``RolloutFnTrainOutput(samples=[[[Sample, ...] per trajectory] per group])``.
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
            "evaluation rollouts do not come from the dressage log; set --eval-function-path"
        )
    from dressage.store.event_store import EventStore
    from dressage.training.consumer import Trainer

    run = _setting(args, "dressage_run", "DRESSAGE_RUN")
    if not run:
        raise ConfigError("set DRESSAGE_RUN (or args.dressage_run) to the run slime should train on")
    options = StepOptions(
        global_batch_size=int(args.global_batch_size),
        n_samples_per_prompt=int(args.n_samples_per_prompt),
        std_normalize=bool(getattr(args, "grpo_std_normalization", False)),
    )
    store = EventStore.open(_setting(args, "dressage_database_url", "DRESSAGE_DATABASE_URL"))
    try:
        consumer = os.environ.get("DRESSAGE_CONSUMER", "slime")
        trainer = Trainer(store, run, options, consumer=consumer)
        step = rollout_id + 1
        ckpt = store.get_checkpoint(run, trainer.consumer)
        if ckpt is not None and ckpt.step >= step:
            batch = trainer.replay()[step - 1]
        else:
            if (ckpt.step if ckpt else 0) != rollout_id:
                raise TrainingError(
                    f"slime asks for rollout {rollout_id} but {trainer.consumer} is at step "
                    f"{ckpt.step if ckpt else 0}; resume slime from the matching checkpoint"
                )
            batch = trainer.run_steps(follow=True, max_steps=1)[0].batch
    finally:
        store.close()
    groups: dict[int, dict[int, list[Any]]] = {}
    for d in slime_dicts(batch.samples):
        groups.setdefault(d["group_index"], {}).setdefault(d["rollout_id"], []).append(Sample.from_dict(d))
    nested = [list(trajs.values()) for trajs in groups.values()]
    return RolloutFnTrainOutput(samples=nested, metrics={"dressage/step": batch.step})
