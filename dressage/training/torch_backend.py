"""The ``torch`` backend: PPO-clip / GRPO with truncated importance sampling on an HF causal LM.

For response token ``t`` of a sample with advantage ``A`` (broadcast from the anchor, or per token:
the node's advantage of a tree, :mod:`dressage.training.trees`), prompt-equal
weight ``w_t``, trainer logprob ``logp_t``, its detached copy ``old_t`` and the engine's
``rollout_t``:

    ratio_t = exp(logp_t - old_t)
    pg_t    = max(-A * ratio_t, -A * clip(ratio_t, 1 - eps_clip, 1 + eps_clip))
    tis_t   = min(exp(old_t - rollout_t), tis_cap)          (truncated importance sampling)
    L       = sum_t w_t * tis_t * pg_t

One optimizer step per formed step (the weights already normalise per step, so per-sample
backward passes simply accumulate). Each step saves, before the log commit, the weights
``step-XXXXXX.safetensors`` (metadata ``(run, position, step, batch_hash)``) and the optimizer
state ``optim-XXXXXX.safetensors`` (every state tensor, e.g. Adam's moments and step counts, plus
the parameter groups and the trained parameters' names as metadata). Resume loads both for the
consumer's committed step, so a resumed trainer continues the same optimisation: its weights are
bitwise equal to an uninterrupted run's on the same hardware with the same torch thread count
(the count decides how CPU matmuls split their sums, so it changes float rounding). The
forward/backward of step ``k`` runs under its own random seed (derived from ``seed`` and ``k``;
the process's global generator is left as it was), so dropout-like randomness, if a model has
any, does not depend on where a run was resumed. With a
:class:`~dressage.training.weight_push.WeightPusher` (``--push-to``), due steps also save a
Hugging Face directory ``hf-vXXXXXX`` and push it to the engines as policy version
``StepBatch.produced_version`` (``trainer_version + 1``), still before the commit (a step redone after a crash pushes again; the
version record is idempotent). torch, transformers and safetensors are imported lazily.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.store.records import ConsumerCheckpoint, Run
from dressage.training.samples import TrainSample
from dressage.training.steps import StepBatch

if TYPE_CHECKING:
    import torch

    from dressage.training.weight_push import WeightPusher

TINY_QWEN3_VOCAB = 4096


def ppo_clip_tis_loss(
    logprobs_R: torch.Tensor,
    rollout_logprobs_R: torch.Tensor,
    advantages_R: torch.Tensor,
    weights_R: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    tis_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted PPO-clip loss with truncated importance sampling (see the module docstring)."""
    import torch

    old_R = logprobs_R.detach()
    ratio_R = torch.exp(logprobs_R - old_R)
    pg_R = torch.maximum(-advantages_R * ratio_R, -advantages_R * ratio_R.clamp(1 - eps_clip, 1 + eps_clip))
    tis_R = torch.exp(old_R - rollout_logprobs_R).clamp(max=tis_cap)
    loss = (weights_R * tis_R * pg_R).sum()
    mask_R = weights_R > 0
    stats = {
        "tis_mean": float(tis_R[mask_R].mean()) if mask_R.any() else 1.0,
        "logprob_diff": float((old_R - rollout_logprobs_R)[mask_R].abs().mean()) if mask_R.any() else 0.0,
    }
    return loss, stats


def importance_weights(
    logprobs_R: torch.Tensor, rollout_R: torch.Tensor, weights_R: torch.Tensor, tis_cap: float
) -> np.ndarray:
    """The truncated importance weight ``tis_t`` the loss multiplied each trained token by (float32
    numpy, 0 on tokens with loss weight 0): what the step records per token (docs/training.md)."""
    import torch

    with torch.no_grad():
        tis_R = torch.exp(logprobs_R.detach() - rollout_R).clamp(max=tis_cap)
        weights = torch.where(weights_R > 0, tis_R, torch.zeros_like(tis_R))
        return np.asarray(weights.cpu().numpy(), dtype=np.float32)


def check_reference(reference: str | None, kl_coef: float) -> None:
    """Refuse a reference other than ``initial`` and a KL coefficient without one (or negative)."""
    if reference not in (None, "initial"):
        raise ConfigError(
            f"reference must be 'initial' (a frozen copy of the starting weights) or unset, got {reference!r}"
        )
    if not math.isfinite(kl_coef) or kl_coef < 0:
        raise ConfigError(f"kl_coef must be a number >= 0, got {kl_coef}")
    if kl_coef > 0 and reference is None:
        raise ConfigError(
            "kl_coef > 0 needs a reference model: set train.reference: initial (--reference initial)"
        )


def response_logprobs(
    model: torch.nn.Module, tokens_L: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s next-token log-distribution at the positions predicting the response ``[R, V]``
    and the logprobs of the response's tokens ``[R]``.

    Only those ``R`` positions go through the output projection and the softmax (``logits_to_keep``,
    for a model whose ``forward`` takes it): the prompt's positions predict nothing that is trained,
    and over a 248k-token vocabulary their logits were most of a step's time and memory (a
    2,000-token prompt: 2 GB of float32 logits, and as much again for their gradient)."""
    import torch

    keep = response_length + 1
    if _takes_logits_to_keep(model):
        logits_KV = model(input_ids=tokens_L[None], logits_to_keep=keep).logits[0]
    else:
        logits_KV = model(input_ids=tokens_L[None]).logits[0]
    logp_all_RV = torch.log_softmax(logits_KV[-keep:-1].float(), dim=-1)
    logp_R = logp_all_RV.gather(-1, tokens_L[tokens_L.shape[0] - response_length :, None])[:, 0]
    return logp_all_RV, logp_R


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` computes logits for the last ``logits_to_keep`` positions only
    (transformers' causal LMs do)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


class ReferenceKL:
    """KL(trainer || reference) over a step's trained tokens, by the k3 estimate
    ``k3_t = exp(ref_t - logp_t) - 1 - (ref_t - logp_t)`` (tokens were sampled near the trainer).

    ``kl_reference``: the mean k3 over trained tokens (loss weight > 0); with ``kl_coef`` > 0 the loss
    gains ``kl_coef * sum_t w_t * k3_t`` (same prompt-equal weights as the policy-gradient term), and
    ``kl_loss`` records that term.
    """

    def __init__(self, kl_coef: float) -> None:
        self.kl_coef = kl_coef
        self.n, self.k3_sum, self.loss_sum = 0, 0.0, 0.0

    def add(
        self, logp_R: torch.Tensor, reference_R: torch.Tensor, weights_R: torch.Tensor
    ) -> torch.Tensor | float:
        """Add one sample; return its loss term (0 without ``kl_coef``)."""
        import torch

        log_r = reference_R.double() - logp_R.double()  # float64 + expm1: k3 ~ log_r**2 / 2 is tiny
        k3_R = torch.expm1(log_r) - log_r
        mask_R = weights_R > 0
        self.n += int(mask_R.sum())
        self.k3_sum += float(k3_R.detach()[mask_R].sum())
        term = (self.kl_coef * (weights_R.double() * k3_R).sum()).float()
        self.loss_sum += float(term.detach())
        return term if self.kl_coef > 0 else 0.0

    def means(self) -> dict[str, float]:
        """``kl_reference`` (and ``kl_loss`` when the term is in the loss)."""
        out = {"kl_reference": self.k3_sum / max(self.n, 1)}
        if self.kl_coef > 0:
            out["kl_loss"] = self.loss_sum
        return out


class TokenStats:
    """Token-level statistics of a step, over its trained tokens (loss weight > 0), all samples pooled.

    * ``entropy``: mean entropy of the trainer's next-token distribution;
    * ``kl_behaviour``: mean k3 estimate of KL(behaviour || trainer), ``r - 1 - log r`` with
      ``r = exp(logp - rollout_logp)`` (tokens were sampled by the behaviour policy);
    * ``clip_fraction``: share of tokens whose PPO ratio left ``[1 - eps_clip, 1 + eps_clip]`` (0 in
      this backend's single pass per step, where the ratio is 1: recorded so a multi-epoch backend
      and this one log the same columns);
    * ``is_ratio_mean``/``is_ratio_max``: the importance ratio ``exp(logp - rollout_logp)`` before
      truncation; ``is_truncated_share``: share of tokens where it exceeded ``tis_cap``.
    """

    def __init__(self, eps_clip: float, tis_cap: float) -> None:
        self.eps_clip, self.tis_cap = eps_clip, tis_cap
        self.n = 0
        self.sums = {"entropy": 0.0, "kl_behaviour": 0.0, "clip_fraction": 0.0, "is_ratio_mean": 0.0}
        self.truncated = 0
        self.is_max = 0.0

    def add(self, logp_all_RV: Any, logp_R: Any, rollout_R: Any, weights_R: Any) -> None:
        """Add one sample's response tokens."""
        import torch

        with torch.no_grad():
            mask_R = weights_R > 0
            if not bool(mask_R.any()):
                return
            lp = logp_all_RV[mask_R].double()
            entropy_R = -(lp.exp() * lp).sum(-1)
            log_r = (logp_R.detach().double() - rollout_R.double())[mask_R]
            ratio = log_r.exp()
            ppo_ratio = torch.ones_like(ratio)  # exp(logp - logp.detach()) in the single pass
            self.n += int(mask_R.sum())
            self.sums["entropy"] += float(entropy_R.sum())
            self.sums["kl_behaviour"] += float((ratio - 1 - log_r).sum())
            outside = (ppo_ratio < 1 - self.eps_clip) | (ppo_ratio > 1 + self.eps_clip)
            self.sums["clip_fraction"] += float(outside.sum())
            self.sums["is_ratio_mean"] += float(ratio.sum())
            self.truncated += int((ratio > self.tis_cap).sum())
            self.is_max = max(self.is_max, float(ratio.max()))

    def means(self) -> dict[str, float]:
        """The statistics (zeros for a step without trained tokens)."""
        n = max(self.n, 1)
        out = {k: v / n for k, v in self.sums.items()}
        out.update(is_ratio_max=self.is_max, is_truncated_share=self.truncated / n)
        return out


def build_model(model: str, seed: int = 0) -> Any:
    """A tiny model of the dev engine (``tiny``: random Qwen3.5-MoE; ``tiny-qwen3.6``,
    ``tiny-deepseek-v3``, ``tiny-mistral-nemo``), ``tiny-qwen3`` (random dense Qwen3, small
    vocabulary, for tests) or a Hugging Face model directory."""
    import torch

    from dressage.engines.tiny_model import TINY_MODELS, build_tiny_model, quiet_transformers

    quiet_transformers()
    if model in TINY_MODELS:
        return build_tiny_model(seed, model)
    if model == "tiny-qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(
            vocab_size=TINY_QWEN3_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=4096,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return Qwen3ForCausalLM(config)
    path = Path(model)
    if not path.is_dir():
        raise ConfigError(
            f"model {model!r} is neither a tiny model ({', '.join(sorted(TINY_MODELS))}), 'tiny-qwen3' "
            "nor a Hugging Face model directory"
        )
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    except (OSError, ValueError) as e:
        raise ConfigError(f"could not load a causal LM from {path}: {e}") from e


def step_seed(seed: int, step: int) -> int:
    """The torch seed of step ``step``'s forward and backward passes."""
    return (seed * 1_000_003 + step) % (2**63 - 1)


def optimizer_tensors(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """An optimizer ``state_dict()`` as safetensors tensors (``state.<param>.<name>``) and metadata.

    Non-tensor state values and the parameter groups go into the metadata as JSON.
    """
    import torch

    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, entries in state["state"].items():
        for name, value in entries.items():
            key = f"state.{idx}.{name}"
            if isinstance(value, torch.Tensor):
                tensors[key] = value.detach().to("cpu").contiguous()
            else:
                scalars[key] = value
    meta = {"param_groups": json.dumps(state["param_groups"]), "scalars": json.dumps(scalars)}
    return tensors, meta


def optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_tensors`: a ``state_dict`` for ``Optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {}
    entries = {**json.loads(meta.get("scalars", "{}")), **tensors}
    for key, value in entries.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    groups = json.loads(meta["param_groups"])
    for group in groups:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def checkpoint_metadata(path: Path) -> dict[str, str]:
    """The ``(run, position, step, batch_hash)`` metadata of a saved checkpoint."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


class TorchBackend:
    """Trains a causal LM in this process (CPU or one GPU)."""

    name = "torch"

    def __init__(
        self,
        out_dir: Path,
        *,
        model: str = "tiny",
        seed: int = 0,
        lr: float = 1e-4,
        eps_clip: float = 0.2,
        tis_cap: float = 2.0,
        device: str = "cpu",
        optimizer: str = "sgd",
        trainable: str = "all",
        push_to: str | None = None,
        push: WeightPusher | None = None,
        reference: str | None = None,
        kl_coef: float = 0.0,
    ) -> None:
        check_reference(reference, kl_coef)
        if push_to is not None:
            raise NotSupportedError(
                "TorchBackend(push_to=...) cannot record policy versions (the backend has no event log); "
                "pass push=WeightPusher(store, urls) instead, as `dressage-worker train --push-to` does"
            )
        if not math.isfinite(lr) or lr <= 0:
            raise ConfigError(f"lr must be a positive number, got {lr}")
        if optimizer not in ("sgd", "adam"):
            raise ConfigError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if trainable not in ("all", "lm_head"):
            raise ConfigError(f"trainable must be 'all' or 'lm_head', got {trainable!r}")
        self.optimizer_name, self.trainable = optimizer, trainable
        self.push = push
        self.out_dir = Path(out_dir)
        self.model_name, self.seed, self.lr = model, seed, lr
        self.eps_clip, self.tis_cap, self.device = eps_clip, tis_cap, device
        self.reference, self.kl_coef = reference, kl_coef
        self.model: Any = None
        self.reference_model: torch.nn.Module | None = None
        """A frozen copy of the initial weights (``reference="initial"``), else None."""
        self.optimizer: Any = None
        self.param_names: list[str] = []
        self.run: Run | None = None

    def checkpoint_path(self, step: int) -> Path:
        """Where step ``step``'s weights go."""
        return self.out_dir / f"step-{step:06d}.safetensors"

    def optimizer_path(self, step: int) -> Path:
        """Where the optimizer state after step ``step`` goes."""
        return self.out_dir / f"optim-{step:06d}.safetensors"

    def prune_checkpoints(self, keep: int) -> list[Path]:
        """Delete the weights and optimizer files of all but the newest ``keep`` steps (after a commit:
        resume needs the files of the committed step). Returns the deleted paths."""
        if keep < 1:
            raise ConfigError(f"keep at least one checkpoint (resume needs the last), got {keep}")
        steps = sorted({int(p.stem.split("-")[1]) for p in self.out_dir.glob("step-*.safetensors")})
        deleted = []
        for step in steps[:-keep]:
            for path in (self.checkpoint_path(step), self.optimizer_path(step)):
                if path.exists():
                    path.unlink()
                    deleted.append(path)
        return deleted

    def hf_dir(self, version: int) -> Path:
        """Where the Hugging Face weights pushed as policy ``version`` go."""
        return self.out_dir / f"hf-v{version:06d}"

    def resume(self, run: Run, checkpoint: ConsumerCheckpoint | None) -> None:
        """Build the model; load the checkpoint of the committed step when there is one."""
        import torch
        from safetensors.torch import load_model

        self.run = run
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.model = build_model(self.model_name, self.seed).to(self.device)
        if self.reference == "initial":  # the weights before step 1, however far training has gone
            self.reference_model = build_model(self.model_name, self.seed).to(self.device).eval()
            self.reference_model.requires_grad_(False)
        committed = checkpoint.step if checkpoint is not None else 0
        if committed > 0:
            assert checkpoint is not None
            path = self._committed_file(self.checkpoint_path(committed), checkpoint)
            load_model(self.model, str(path), device=self.device)
        # trainable="lm_head" trains only the output projection: on a random-weight model this moves
        # token preferences without scrambling the hidden states (a demo of learning, not a recipe).
        named = [
            (n, p)
            for n, p in self.model.named_parameters()
            if self.trainable == "all" or n.startswith("lm_head.")
        ]
        self.param_names = [n for n, _ in named]
        params = [p for _, p in named]
        for p in self.model.parameters():
            p.requires_grad_(any(p is q for q in params))
        opt_class = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.SGD
        self.optimizer = opt_class(params, lr=self.lr)
        if committed > 0:
            assert checkpoint is not None
            self._load_optimizer(self._committed_file(self.optimizer_path(committed), checkpoint))

    def _committed_file(self, path: Path, checkpoint: ConsumerCheckpoint) -> Path:
        """``path`` after checking that it exists and belongs to the committed (run, step)."""
        assert self.run is not None
        if not path.exists():
            raise TrainingError(
                f"the log says {checkpoint.consumer} committed step {checkpoint.step}, but {path} is "
                "missing; restore it or train under a new --consumer name"
            )
        meta = checkpoint_metadata(path)
        if meta.get("run") != self.run.name or meta.get("step") != str(checkpoint.step):
            raise TrainingError(
                f"{path} belongs to run {meta.get('run')} step {meta.get('step')}, not to run "
                f"{self.run.name} step {checkpoint.step}; use an --out directory of this consumer"
            )
        return path

    def _load_optimizer(self, path: Path) -> None:
        from safetensors.torch import load_file

        meta = checkpoint_metadata(path)
        saved = (meta.get("optimizer"), json.loads(meta.get("param_names", "[]")))
        if saved != (self.optimizer_name, self.param_names):
            raise TrainingError(
                f"{path} holds {saved[0]} state for {len(saved[1])} parameters, but this trainer runs "
                f"{self.optimizer_name} on {len(self.param_names)} ({self.trainable!r}); resume with the "
                "optimizer and trainable setting of the run, or train under a new --consumer name"
            )
        self.optimizer.load_state_dict(optimizer_state(load_file(str(path)), meta))

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """One optimizer step over the batch (per-sample forward/backward), then a checkpoint.

        Returns the step's metrics (see :class:`TokenStats`): ``loss``, ``pg_loss``, ``entropy``,
        ``kl_behaviour``, ``grad_norm`` (L2 over the trained parameters' gradients, before any
        clipping: the backend clips none), ``lr``, ``clip_fraction``, ``is_ratio_mean``/``_max``,
        ``is_truncated_share``, and the older ``tis_mean``/``logprob_diff``.
        """
        import torch

        assert self.model is not None and self.run is not None, "call resume() first"
        device = torch.device(self.device)
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(step_seed(self.seed, batch.step))
            total, stats = self._backward(batch)
        metrics = {"loss": total, **stats, "grad_norm": self.grad_norm()}
        metrics["lr"] = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self._save(batch)
        if self.push is not None and self.push.due(batch.step):
            metrics.update(self._push(batch.produced_version))
        return metrics

    def grad_norm(self) -> float:
        """The L2 norm of the trained parameters' gradients (what a clip would look at)."""
        import torch

        grads = [
            p.grad.detach().double() for p in self.optimizer.param_groups[0]["params"] if p.grad is not None
        ]
        return (
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            if grads
            else 0.0
        )

    def _backward(self, batch: StepBatch) -> tuple[float, dict[str, float]]:
        """Per-sample forward and backward passes; gradients accumulate over the batch."""
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, stats_sum = 0.0, {"tis_mean": 0.0, "logprob_diff": 0.0, "pg_loss": 0.0}
        tokens = TokenStats(self.eps_clip, self.tis_cap)
        kl = ReferenceKL(self.kl_coef) if self.reference_model is not None else None
        for s in batch.samples:
            if int(s.tokens.max()) >= vocab:
                raise TrainingError(
                    f"session {s.session_id} segment {s.segment_index} has token id {int(s.tokens.max())}, "
                    f"outside the model's vocabulary of {vocab}; train the model the run was sampled from"
                )
            loss, stats = self._sample_loss(s, tokens, kl)
            loss.backward()
            total += float(loss.detach())
            for k in ("tis_mean", "logprob_diff"):
                stats_sum[k] += stats[k] / len(batch.samples)
            stats_sum["pg_loss"] += stats["pg_loss"]
        return total, {**stats_sum, **tokens.means(), **(kl.means() if kl is not None else {})}

    def _sample_loss(
        self, s: TrainSample, tokens: TokenStats, kl: ReferenceKL | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One sample's loss (PPO-clip with TIS, plus the KL term with ``kl_coef``) and statistics;
        sets the sample's importance weights."""
        import torch

        tokens_L = torch.as_tensor(s.tokens, dtype=torch.long, device=self.device)
        logp_all_RV, logprobs_R = response_logprobs(self.model, tokens_L, s.response_length)
        f32, dev = torch.float32, self.device
        rollout_R = torch.as_tensor(s.rollout_log_probs, dtype=f32, device=dev)
        weights_R = torch.as_tensor(s.loss_weights, dtype=f32, device=dev)
        loss, stats = ppo_clip_tis_loss(
            logprobs_R,
            rollout_R,
            torch.as_tensor(s.advantages, dtype=f32, device=dev)  # a tree sample: per token
            if s.advantages is not None
            else torch.full((s.response_length,), s.advantage, dtype=f32, device=dev),
            weights_R,
            eps_clip=self.eps_clip,
            tis_cap=self.tis_cap,
        )
        stats["pg_loss"] = float(loss.detach())
        tokens.add(logp_all_RV, logprobs_R, rollout_R, weights_R)
        s.importance_weights = importance_weights(logprobs_R, rollout_R, weights_R, self.tis_cap)
        if kl is not None and self.reference_model is not None:
            with torch.no_grad():
                _, reference_R = response_logprobs(self.reference_model, tokens_L, s.response_length)
            loss = loss + kl.add(logprobs_R, reference_R, weights_R)
        return loss, stats

    def _save(self, batch: StepBatch) -> None:
        """Write the optimizer state, then the weights, each atomically (temp file + rename)."""
        from safetensors.torch import save_file, save_model

        assert self.run is not None
        meta = {
            "run": self.run.name,
            "position": str(batch.position),
            "step": str(batch.step),
            "batch_hash": batch.batch_hash,
            "policy_version": str(batch.produced_version),
            "model": json.dumps(self.model_name),
        }
        tensors, opt_meta = optimizer_tensors(self.optimizer.state_dict())
        opt_meta.update(meta, optimizer=self.optimizer_name, param_names=json.dumps(self.param_names))
        tmp = self.optimizer_path(batch.step).with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata=opt_meta)
        tmp.replace(self.optimizer_path(batch.step))
        tmp = self.checkpoint_path(batch.step).with_suffix(".tmp")
        save_model(self.model, str(tmp), metadata=meta)
        tmp.replace(self.checkpoint_path(batch.step))

    def _push(self, version: int) -> dict[str, float]:
        """Save the model as an HF directory (atomically renamed into place) and push it."""
        import shutil

        assert self.push is not None and self.run is not None
        final = self.hf_dir(version)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp))
        shutil.rmtree(final, ignore_errors=True)
        tmp.replace(final)
        result = self.push.push(self.run, version, final)
        return {"pushed_version": float(version), "push_s": result.seconds}
