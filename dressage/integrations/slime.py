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
* slime calls the evaluation function with ``evaluation=True`` and expects
  ``RolloutFnEvalOutput(data={name: {"rewards", "truncated", "samples"}})``;
  ``--eval-function-path`` defaults to ``--rollout-function-path``. ``RolloutManager.eval``
  returns early under ``--debug-train-only``, so slime itself asks for evaluations only when it
  runs its own (or external, ``--rollout-external-engine-addrs``) SGLang engines.
* ``--custom-pg-loss-reducer-function-path`` is called as ``fn(total_lengths, response_lengths,
  loss_masks, calculate_per_token_loss)`` and returns ``x -> loss``; slime multiplies the result
  by ``num_microbatches / global_batch_size * dp_size`` (``loss_function`` in
  ``slime/backends/megatron_utils/loss.py``).
* slime's ``parse_args(add_custom_arguments=...)`` lets a launcher add ``--dressage-*`` options.
* slime's plugin contract (``tests/plugin_contracts/test_plugin_rollout_contracts.py``) calls
  ``fn(None, 2, data_source)`` and checks ``len(group) == n_samples_per_prompt`` with ``Sample``
  members, i.e. the plain ``[group][trajectory]`` shape.
* slime's reward post-processing normalises per group by reshaping rewards to
  ``[-1, n_samples_per_prompt]``, which is wrong once a trajectory has several segments. So
  dressage writes its own broadcast advantage into ``reward`` (the raw reward goes to
  ``metadata["raw_reward"]``, which slime logs) and the command line says
  ``--disable-rewards-normalization``.
* slime reads routed experts only when the first sample has them, then from every sample; a step
  where some sample lacks them is written without experts.
* The rollout function runs inside ``RolloutManager``, a Ray actor (``slime/ray/rollout.py``), so
  Ray is initialised there. Without ``--debug-train-only`` slime starts its router and sets
  ``args.sglang_router_ip`` / ``args.sglang_router_port``; each ``SGLangEngine`` actor registers
  ``http://{host}:{port}`` with ``POST /workers`` (host = its node's IP, ``get_host_info``), and
  ``GET /workers`` lists ``{"workers": [{"url": ...}]}`` (slime's own ``abort`` reads it so). With
  ``--dressage-config``, :func:`start_rollout_actors` places dressage's workers and proxies there.
"""

from __future__ import annotations

import shlex
import time
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dressage.config import Settings, load_settings
from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training.masking import MaskingPolicy
from dressage.training.samples import SLIME_COMMIT, TrainSample
from dressage.training.steps import StepBatch, StepOptions
from dressage.training.trees import node_samples

__all__ = [
    "PG_LOSS_REDUCER_PATH",
    "SLIME_COMMIT",
    "SlimeDumpBackend",
    "SlimeRolloutBackend",
    "add_dressage_arguments",
    "generate_rollout",
    "prompt_equal_pg_loss_reducer",
    "rollout_options",
    "sample_to_slime_dict",
    "slime_command",
    "slime_engine_urls",
    "slime_rollout_command",
    "start_rollout_actors",
    "stop_rollout_actors",
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


def prompt_equal_rewards(samples: Sequence[TrainSample], global_batch_size: int) -> list[float]:
    """``A_s * G * w_s``: each sample's advantage times its prompt-equal weight and slime's ``G``.

    ``w_s = 1 / (P * N_p)`` is the weight every trainable token of sample ``s`` carries (its
    prompt's, :mod:`dressage.training.weights`); with :func:`prompt_equal_pg_loss_reducer` slime's
    step loss becomes ``sum_{s,t} w_{s,t} * l_{s,t}``. A sample without trainable tokens keeps its
    advantage (nothing of it is trained).
    """
    out = []
    for s in samples:
        weights_R = s.loss_weights
        trained_R = s.loss_mask.astype(bool)
        if weights_R is None or not trained_R.any():
            out.append(float(s.advantage))
            continue
        out.append(float(s.advantage) * global_batch_size * float(weights_R[trained_R][0]))
    return out


def slime_dicts(
    samples: Sequence[TrainSample], *, prompt_equal_scale: int | None = None
) -> list[dict[str, Any]]:
    """The step's samples as slime dicts, experts kept only when every sample has them.

    With ``prompt_equal_scale`` (slime's ``G``), ``reward`` is :func:`prompt_equal_rewards`' value
    and ``metadata["dressage_advantage"]`` the plain advantage. A tree sample (per-token advantages)
    becomes one sample per node it trains (:func:`~dressage.training.trees.node_samples`), siblings
    sharing its ``rollout_id``.
    """
    samples = [part for s in samples for part in node_samples(s)]  # a tree's nodes: one advantage each
    with_experts = all(s.rollout_routed_experts is not None for s in samples)
    dicts = [sample_to_slime_dict(s, with_experts=with_experts) for s in samples]
    if prompt_equal_scale is not None:
        for d, s, reward in zip(
            dicts, samples, prompt_equal_rewards(samples, prompt_equal_scale), strict=True
        ):
            d["reward"] = reward
            d["metadata"]["dressage_advantage"] = float(s.advantage)
    return dicts


def masking_arguments(policy: MaskingPolicy) -> list[str]:
    """``policy`` as the ``--dressage-*`` options of :func:`add_dressage_arguments`."""
    args: list[str] = []
    if policy.max_staleness is not None:
        args += ["--dressage-max-staleness", str(policy.max_staleness)]
    if policy.last_version_only:
        args += ["--dressage-last-version-only"]
    if policy.group_version_window is not None:
        args += ["--dressage-group-version-window", str(policy.group_version_window)]
    if policy.failure_policy != "drop_group":
        args += ["--dressage-failure-policy", policy.failure_policy]
    return args


def _step_arguments(options: StepOptions) -> list[str]:
    """The slime options that make one slime rollout one dressage step, shared by
    :func:`slime_command` and :func:`slime_rollout_command`: train only, the step's batch shape
    (``--global-batch-size`` trajectories, ``n_samples_per_prompt`` each), GRPO advantages without
    slime's reward normalization, reduced by dressage's prompt-equal loss reducer."""
    n = options.n_samples_per_prompt
    return [
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
        "--custom-pg-loss-reducer-function-path",
        PG_LOSS_REDUCER_PATH,
    ]


def slime_command(pattern: str, options: StepOptions, n_steps: int | None = None) -> str:
    """The slime command that trains on dumped files matching ``pattern`` (``.../{rollout_id}.pt``).

    One slime rollout = one dressage step = one slime optimizer step (``--global-batch-size`` =
    the step's trajectories), reduced with dressage's prompt-equal weights
    (``--custom-pg-loss-reducer-function-path``, the rewards in the files are scaled for it). The
    version masking the files were formed with is in their loss masks; the trailing comment says
    which options made them (the same ``--dressage-*`` options a live ``generate_rollout`` reads).
    """
    args = ["--load-debug-rollout-data", pattern, *_step_arguments(options)]
    if n_steps is not None:
        args += ["--num-rollout", str(n_steps)]
    masking = " ".join(masking_arguments(options.masking)) or "none"
    return (
        "python train.py "
        + " ".join(shlex.quote(a) for a in args)
        + f"  # plus your model/parallel args; loss masks carry the version masking {masking}"
    )


def slime_rollout_command(run: str, options: StepOptions) -> str:
    """The live variant: slime asks :func:`generate_rollout` for each step (launcher: docs/architecture.md)."""
    args = [
        "--rollout-function-path",
        "dressage.integrations.slime.generate_rollout",
        *_step_arguments(options),
        "--dressage-run",
        run,
        *masking_arguments(options.masking),
    ]
    return (
        "python train_dressage.py "
        + " ".join(shlex.quote(a) for a in args)
        + "  # plus your model/parallel args"
    )


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
        """Write the step's file atomically (temp file + rename) before the log commit.

        ``reward`` is scaled for :func:`prompt_equal_pg_loss_reducer` (see :func:`slime_command`).
        """
        import torch

        rollout_id = batch.step - 1
        path = Path(self.pattern.format(rollout_id=rollout_id))
        tmp = path.with_suffix(".tmp")
        samples = slime_dicts(
            batch.samples, prompt_equal_scale=batch.manifest["options"]["global_batch_size"]
        )
        torch.save({"rollout_id": rollout_id, "samples": samples}, tmp)
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


def _arg(args: Namespace | None, attr: str) -> Any:
    """``args.attr`` when slime's args (a namespace, or None in slime's contract tests) have it."""
    return getattr(args, attr, None) if args is not None else None


def _recorded(run: Run, *path: str) -> Any:
    """A value of the run's recorded config (``run.config['rollout']['n_samples_per_prompt']``)."""
    node: Any = run.config
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def masking_options(args: Namespace) -> MaskingPolicy:
    """Version masking from slime's args (``--dressage-max-staleness``, ``--dressage-last-version-only``,
    ``--dressage-group-version-window``, ``--dressage-failure-policy``: see :func:`add_dressage_arguments`).

    Applied by dressage when it forms the step: the masked tokens have ``loss_mask`` 0 in the
    samples slime receives, so slime needs no option of its own for them.
    """
    policy = _arg(args, "dressage_failure_policy") or "drop_group"
    return MaskingPolicy(
        max_staleness=_arg(args, "dressage_max_staleness"),
        last_version_only=bool(_arg(args, "dressage_last_version_only")),
        group_version_window=_arg(args, "dressage_group_version_window"),
        failure_policy=policy,
        staleness_reference="trainer",  # slime's rollout id is its trainer's version
    )


def rollout_options(
    args: Namespace, run: Run | None = None, *, n_tasks: int | None = None, settings: Settings | None = None
) -> StepOptions:
    """The step options of one slime rollout, from slime's arguments, else the run's recorded config.

    One slime rollout (one ``generate_rollout`` call, one dressage step) holds ``P`` prompts
    (groups) of ``n`` trajectories; slime splits it into its own optimizer steps of
    ``global_batch_size`` trajectories.

    * ``n``: ``args.n_samples_per_prompt``, else the run's ``n_samples_per_prompt``.
    * ``P``: ``args.rollout_batch_size``; else ``args.global_batch_size / n``; else
      ``DRESSAGE_SLIME_ROLLOUT_BATCH_SIZE``; else the loop's recorded ``global_batch_size / n``;
      else the run's number of tasks ``n_tasks`` (one step per pass over the dataset).
    * the advantage estimator: ``tree`` for a tree run (its config has ``branching``), else ``grpo``.
    * ``grpo_std_normalization`` becomes the advantage's std normalisation (dressage divides by the
      group's population std, ``ddof=0``; slime's own normalisation uses the sample std).
    * version masking: :func:`masking_options`.

    slime's own reward normalisation must be off (``--disable-rewards-normalization``): dressage
    writes the broadcast advantage into ``Sample.reward`` and slime would normalise it again over
    ``[-1, n_samples_per_prompt]``, which is wrong once a trajectory has several segments.
    """
    if _arg(args, "rewards_normalization"):
        raise ConfigError(
            "slime's reward normalisation is on; pass --disable-rewards-normalization (dressage already "
            "writes the per-group advantage, broadcast to every segment, into Sample.reward)"
        )
    settings = settings or load_settings()
    recorded_n = _recorded(run, "rollout", "n_samples_per_prompt") if run is not None else None
    n = _arg(args, "n_samples_per_prompt") or recorded_n
    if n is None:
        raise ConfigError(
            "generate_rollout needs slime's args.n_samples_per_prompt and args.rollout_batch_size "
            "(or args.global_batch_size), or a run whose recorded config has n_samples_per_prompt"
        )
    n = int(n)
    trajectories: int | None = None
    if _arg(args, "rollout_batch_size") is not None:
        trajectories = int(args.rollout_batch_size) * n
    elif _arg(args, "global_batch_size") is not None:
        trajectories = int(args.global_batch_size)
    elif settings.slime_rollout_batch_size is not None:
        trajectories = settings.slime_rollout_batch_size * n
    elif run is not None and _recorded(run, "loop", "global_batch_size") is not None:
        trajectories = int(_recorded(run, "loop", "global_batch_size"))
    elif n_tasks:
        trajectories = n_tasks * n
    if trajectories is None:
        raise ConfigError(
            "generate_rollout needs slime's args.rollout_batch_size (or DRESSAGE_SLIME_ROLLOUT_BATCH_SIZE); "
            "the run has no recorded batch size and no tasks yet"
        )
    tree = run is not None and bool(_recorded(run, "rollout", "branching"))
    return StepOptions(
        global_batch_size=trajectories,
        n_samples_per_prompt=n,
        advantage_estimator="tree" if tree else "grpo",  # a tree run's groups need it (docs/trees.md)
        std_normalize=bool(_arg(args, "grpo_std_normalization")),
        masking=masking_options(args),
    )


def add_dressage_arguments(parser: ArgumentParser) -> ArgumentParser:
    """dressage's options for slime's ``parse_args(add_custom_arguments=add_dressage_arguments)``.

    slime's ``train.py`` parses only its own options; a launcher that passes this function makes
    slime accept (and hand to :func:`generate_rollout` in ``args``) the run, database, consumer and
    version-masking options.
    """
    group = parser.add_argument_group("dressage")
    group.add_argument("--dressage-run", type=str, default=None, help="The run to train on (DRESSAGE_RUN).")
    group.add_argument(
        "--dressage-database-url", type=str, default=None, help="The log (DRESSAGE_DATABASE_URL)."
    )
    group.add_argument("--dressage-consumer", type=str, default=None, help="Consumer name (default slime).")
    group.add_argument(
        "--dressage-max-staleness", type=int, default=None, help="Mask tokens this many versions old."
    )
    group.add_argument("--dressage-last-version-only", action="store_true", default=False)
    group.add_argument("--dressage-group-version-window", type=int, default=None)
    group.add_argument("--dressage-failure-policy", choices=["drop_group", "keep_finished"], default=None)
    group.add_argument(
        "--dressage-config",
        type=str,
        default=None,
        help="run.yaml: start dressage's rollout workers and proxies as Ray actors next to slime's SGLang "
        "engines (their URLs from slime's router); needs dressage's ray extra.",
    )
    return parser


def _slime_types() -> tuple[Any, Any, Any]:
    """slime's ``Sample``, ``RolloutFnTrainOutput`` and ``RolloutFnEvalOutput`` (slime must be importable)."""
    try:
        from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
        from slime.utils.types import Sample
    except ImportError as e:
        raise NotSupportedError(
            "dressage.integrations.slime:generate_rollout runs inside slime, which is not importable "
            f"here ({e}); install slime (THUDM/slime) or use `dressage-worker train --backend slime-dump`"
        ) from e
    return Sample, RolloutFnTrainOutput, RolloutFnEvalOutput


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime rollout function: step ``rollout_id + 1`` of consumer ``train:slime`` from the log.

    For ``--rollout-function-path dressage.integrations.slime.generate_rollout`` with
    ``--debug-train-only`` (no SGLang engines: the samples come from the log, ``data_source`` is not
    read). Run and database come from ``args.dressage_run`` / ``args.dressage_database_url`` or the
    settings (``DRESSAGE_RUN``, ``DRESSAGE_DATABASE_URL``); the consumer from
    ``args.dressage_consumer`` or ``DRESSAGE_CONSUMER`` (default ``slime``). ``args`` may be None or
    partial: the step options then come from the run's recorded config (:func:`rollout_options`).

    * A fresh consumer starts at ``rollout_id`` (slime started with ``--start-rollout-id k`` or
      from a checkpoint trained elsewhere): its first step is ``k + 1`` and its checkpoint keeps
      ``start_step = k``.
    * The next uncommitted step: formed, waiting (polling the log) until enough groups are ready,
      and committed with the consumer checkpoint before it is returned; slime trains on it afterwards.
    * An already committed step (slime restarted from an older checkpoint): re-formed and checked
      against its recorded batch hash, not committed again.
    * A step beyond the next one, or before the consumer's start: :class:`TrainingError`.

    Returns ``RolloutFnTrainOutput(samples=..., metrics={...})``: ``[group][trajectory]`` (slime's
    plain shape) when every trajectory of the rollout is one segment, else
    ``[group][trajectory][segment]`` (slime's compact shape; segments of one trajectory share
    ``rollout_id``). ``reward`` is the broadcast advantage, scaled by the prompt-equal weight when
    slime uses :func:`prompt_equal_pg_loss_reducer` (see :func:`prompt_equal_rewards`).

    ``evaluation=True``: :func:`evaluation_output`.
    """
    sample_cls, train_output_cls, eval_output_cls = _slime_types()
    from dressage.store.event_store import EventStore

    settings = load_settings()
    placed_run = start_rollout_actors(args, settings) if _arg(args, "dressage_config") else None
    if placed_run is not None and _arg(args, "dressage_run") not in (None, placed_run):
        raise ConfigError(
            f"--dressage-run {args.dressage_run!r} but --dressage-config plays run {placed_run!r}; drop one"
        )
    run_name = _arg(args, "dressage_run") or placed_run or settings.run
    if not run_name:
        raise ConfigError("set DRESSAGE_RUN (or args.dressage_run) to the run slime should train on")
    store = EventStore.open(_arg(args, "dressage_database_url"), settings=settings)
    try:
        run = store.runs.get(run_name)
        if evaluation:
            return evaluation_output(store, run, sample_cls, eval_output_cls)
        batch = _serve_step(store, run, args, rollout_id, settings)
    finally:
        store.close()
    reducer_scale = _reducer_scale(args, int(batch.manifest["options"]["global_batch_size"]))
    dicts = slime_dicts(batch.samples, prompt_equal_scale=reducer_scale)
    groups: dict[int, dict[int, list[Any]]] = {}
    for d in dicts:
        groups.setdefault(d["group_index"], {}).setdefault(d["rollout_id"], []).append(
            sample_cls.from_dict(d)
        )
    compact = any(len(traj) > 1 for trajs in groups.values() for traj in trajs.values())
    nested: list[Any] = [
        [traj if compact else traj[0] for traj in trajs.values()] for trajs in groups.values()
    ]
    metrics = {
        "dressage/step": batch.step,
        "dressage/samples": batch.manifest["n_samples"],
        "dressage/trajectories": batch.manifest["n_trajectories"],
        "dressage/trainable_tokens": batch.manifest["n_trainable_tokens"],
    }
    return train_output_cls(samples=nested, metrics=metrics)


# --- dressage's rollout workers and proxies inside slime's Ray cluster -------------------------------

_PLACED: Any = None
"""The actors :func:`start_rollout_actors` placed (one placement per slime rollout-manager process)."""


def slime_engine_urls(args: Namespace, *, timeout_s: float = 30.0) -> list[str]:
    """The SGLang engines slime started: ``GET /workers`` of slime's router.

    slime's ``RolloutManager`` starts the router and sets ``args.sglang_router_ip`` /
    ``args.sglang_router_port``; each engine actor registers ``http://{its node IP}:{port}`` there
    (``SGLangEngine._register_to_router``), so the URL's host is the engine's Ray node.
    """
    import httpx

    ip, port = _arg(args, "sglang_router_ip"), _arg(args, "sglang_router_port")
    if not ip or not port:
        raise ConfigError(
            "--dressage-config starts dressage's workers next to slime's SGLang engines, but slime's args have "
            "no sglang_router_ip/port: run slime with its own engines (without --debug-train-only)"
        )
    try:
        reply = httpx.get(f"http://{ip}:{port}/workers", timeout=timeout_s)
        reply.raise_for_status()
        urls = [str(w["url"]) for w in reply.json()["workers"]]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"slime's router at {ip}:{port} did not list its engines (GET /workers): {e}"
        ) from None
    if not urls:
        raise ConfigError(f"slime's router at {ip}:{port} lists no engines yet (GET /workers)")
    return urls


def start_rollout_actors(args: Namespace, settings: Settings) -> str:
    """Once per process: dressage's rollout workers and one proxy per slime engine as actors in
    slime's Ray cluster; returns the run's name.

    The run comes from ``args.dressage_config`` (a ``run.yaml`` whose ``engine`` section is replaced
    by slime's engines, :func:`slime_engine_urls`); placement from its ``ray:`` section, each proxy
    on its engine's node (:mod:`dressage.cluster.ray_rollout`). The workers play the run's tasks in
    the background while :func:`generate_rollout` serves slime steps from the log as groups finish.
    """
    global _PLACED
    if _PLACED is not None:
        return str(_PLACED.run.name)
    import asyncio

    from rich.console import Console

    from dressage.cluster import ray_rollout_module
    from dressage.rollout.worker import WorkerOptions
    from dressage.store.event_store import EventStore

    module = ray_rollout_module()
    url = _arg(args, "dressage_database_url")
    placement_settings = settings.model_copy(update={"database_url": url}) if url else settings
    opts = WorkerOptions(config_path=str(args.dressage_config), show_progress=False)
    store = EventStore.open(settings=placement_settings)
    try:
        placed = asyncio.run(
            module.place_run(
                store, placement_settings, opts, "auto", Console(stderr=True), slime_engine_urls(args)
            )
        )
    finally:
        store.close()
    placed.placement.launch(placed.run)
    _PLACED = placed
    return str(placed.run.name)


def stop_rollout_actors() -> None:
    """Kill the actors :func:`start_rollout_actors` placed (slime ends them with its job otherwise)."""
    global _PLACED
    if _PLACED is not None:
        _PLACED.stop()
        _PLACED = None


def _serve_step(store: Any, run: Run, args: Namespace, rollout_id: int, settings: Settings) -> StepBatch:
    """The step for slime's ``rollout_id``: formed and committed, or re-formed when committed."""
    from dressage.training.consumer import Trainer

    n_tasks = None
    if _arg(args, "rollout_batch_size") is None and _arg(args, "global_batch_size") is None:
        counts = store.tasks.counts(run, kind="train")
        n = _arg(args, "n_samples_per_prompt") or _recorded(run, "rollout", "n_samples_per_prompt") or 1
        n_tasks = sum(counts.values()) // int(n)
    options = rollout_options(args, run, n_tasks=n_tasks, settings=settings)
    consumer = _arg(args, "dressage_consumer") or settings.consumer or "slime"
    trainer = Trainer(store, run, options, SlimeRolloutBackend(), consumer=consumer)
    step = rollout_id + 1
    ckpt = store.consumers.checkpoint(run, trainer.consumer)
    if ckpt is None:
        trainer.start_step = rollout_id
        return trainer.run_steps(follow=True, max_steps=1)[0].batch
    first = int(ckpt.state.get("start_step", 0)) + 1
    if first <= step <= ckpt.step:
        return trainer.replay(upto=step)[-1]
    if step == ckpt.step + 1:
        return trainer.run_steps(follow=True, max_steps=1)[0].batch
    raise TrainingError(
        f"slime asks for rollout {rollout_id} (step {step}) but {trainer.consumer} of run {run.name!r} "
        f"holds steps {first}..{ckpt.step}; resume slime from a checkpoint at rollout {first - 1}.."
        f"{ckpt.step}, or point it at another consumer (--dressage-consumer / DRESSAGE_CONSUMER)"
    )


def evaluation_output(
    store: Any, run: Run, sample_cls: Any, eval_output_cls: Any, *, poll_s: float = 0.5
) -> Any:
    """slime's ``RolloutFnEvalOutput`` for the newest complete eval round at or after the current version.

    The current version is the newest ``policy_version`` the log records (0 before any): the policy
    the rollout workers serve now. Waits (polling the log) until a round at or after it is complete,
    as a train step waits for groups. ``data = {eval.name: {"rewards", "truncated", "samples"}}``
    over the round's finished sessions; each sample is the session's anchor segment with
    ``reward`` = the raw reward. Raises :class:`ConfigError` when the run has no ``eval:`` section.
    """
    from dressage.rollout.evaluation import read_eval_rounds

    eval_cfg = _recorded(run, "rollout", "eval")
    if not isinstance(eval_cfg, dict):
        raise ConfigError(
            f"run {run.name!r} has no eval: section, so its workers run no eval sessions; add one to "
            "run.yaml (eval: {dataset: {path: ...}}) or give slime --eval-function-path of another evaluator"
        )
    current = store.versions.latest(run) or 0
    while True:
        ready = [r for r in read_eval_rounds(store, run) if r.complete and r.version >= current]
        if ready:
            break
        time.sleep(poll_s)
    rnd = ready[-1]
    samples, truncated = _eval_samples(store, rnd.sessions, sample_cls)
    name = str(eval_cfg.get("name") or "eval")
    data = {
        name: {
            "rewards": [float(s.reward) for s in rnd.sessions if s.reward is not None],
            "truncated": truncated,
            "samples": samples,
        }
    }
    metrics = {
        "dressage/eval_version": rnd.version,
        "dressage/eval_sessions": len(rnd.sessions),
        "dressage/eval_failed": rnd.pairs - len(rnd.sessions),
    }
    return eval_output_cls(data=data, metrics=metrics)


def _eval_samples(store: Any, sessions: Sequence[Any], sample_cls: Any) -> tuple[list[Any], list[bool]]:
    """The anchor segment of each finished eval session as a slime ``Sample`` (reward = raw reward)."""
    from dressage.training.materialize import Trajectory, materialize_trajectory

    turns: dict[str, list[Any]] = {s.id: [] for s in sessions}
    for turn in store.turns.read(session_ids=list(turns), with_experts=False) if turns else []:
        turns[turn.session_id].append(turn)
    samples, truncated = [], []
    for i, session in enumerate(sessions):
        if session.reward is None:
            why = session.info.get("no_scalar_reward") or "no reason was recorded"
            raise TrainingError(
                f"eval session {session.id} finished without a scalar reward: {why}; slime's eval "
                "needs one number per session (give the run a reward.key or reward.weights)"
            )
        is_truncated = session.finish_reason == "length"
        status = "truncated" if is_truncated else "completed"
        index = int(session.info.get("task_index", i))
        traj = Trajectory(session.id, float(session.reward), status, index, index, index)
        anchor = next(s for s in materialize_trajectory(turns[session.id], traj) if s.is_anchor)
        d = sample_to_slime_dict(anchor, with_experts=False)
        d["reward"] = float(session.reward)
        d["metadata"]["dressage_eval_version"] = session.info.get("eval_version")
        samples.append(sample_cls.from_dict(d))
        truncated.append(is_truncated)
    return samples, truncated


# --- our loss weights inside slime ---------------------------------------------------------------

PG_LOSS_REDUCER_PATH = "dressage.integrations.slime.prompt_equal_pg_loss_reducer"
"""What to pass to slime's ``--custom-pg-loss-reducer-function-path``."""


def prompt_equal_pg_loss_reducer(
    total_lengths: list[int],
    response_lengths: list[int],
    loss_masks: list[Any],
    calculate_per_token_loss: bool = False,
) -> Callable[[Any], Any]:
    """slime pg_loss reducer (signature of ``--custom-pg-loss-reducer-function-path`` at the pinned
    commit): the masked sum of per-token losses, ``x -> sum_s sum_t mask_{s,t} * x_{s,t}``.

    slime's default reducer divides each sample's sum by its rollout's trainable tokens; here
    there is no division: the prompt-equal weight ``1 / (P * N_p)`` of the sample's prompt, times
    slime's ``global_batch_size`` ``G`` (slime multiplies the reduced loss by ``1 / G``), is already
    in the sample's advantage (``Sample.reward``, :func:`prompt_equal_rewards`), and the policy
    loss is linear in the advantage (``-A * ratio``, clipped: ``min`` of two terms scaled by the same
    positive factor), so slime's step loss is ``sum w_{s,t} * l_{s,t}``, the torch backend's.
    With context parallelism the sum is slime's own (``get_sum_of_sample_mean`` with unit
    denominators), which knows how the sequence is chunked. ``calculate_per_token_loss`` divides
    by the step's token count instead, which is not prompt-equal: refused.
    """
    if calculate_per_token_loss:
        raise ConfigError(
            "dressage's prompt-equal reducer needs --calculate-per-token-loss off (that option divides the "
            "loss by the step's token count, which undoes the per-prompt weights)"
        )
    import torch

    try:  # inside slime's trainer: its CP-aware sum
        from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean

        ones = [torch.ones((), device=m.device) for m in loss_masks]
        reducer: Callable[[Any], Any] = get_sum_of_sample_mean(
            total_lengths, response_lengths, loss_masks, ones, False
        )
        return reducer
    except ImportError:  # no Megatron here: context parallel size is 1
        pass
    lengths = [int(r) for r in response_lengths]

    def masked_token_sum(x_T: Any) -> Any:
        parts = x_T.split(lengths, dim=0)
        total = x_T.new_zeros(())
        for x_R, mask_R in zip(parts, loss_masks, strict=True):
            total = total + (x_R * mask_R).sum()
        return total

    return masked_token_sum


def _reducer_scale(args: Namespace, n_trajectories: int) -> int | None:
    """slime's ``G`` when it reduces with :func:`prompt_equal_pg_loss_reducer`, else None.

    Prompt-equal denominators are per optimizer step, so slime must take one optimizer step per
    rollout (``--global-batch-size`` = the rollout's trajectories).
    """
    if _arg(args, "custom_pg_loss_reducer_function_path") != PG_LOSS_REDUCER_PATH:
        return None
    if _arg(args, "calculate_per_token_loss"):
        raise ConfigError(f"{PG_LOSS_REDUCER_PATH} needs --calculate-per-token-loss off")
    gbs = _arg(args, "global_batch_size")
    if gbs is not None and int(gbs) != n_trajectories:
        raise ConfigError(
            f"{PG_LOSS_REDUCER_PATH} weighs prompts per optimizer step: set --global-batch-size to the "
            f"rollout's {n_trajectories} trajectories (rollout-batch-size x n-samples-per-prompt), not {gbs}"
        )
    return n_trajectories
