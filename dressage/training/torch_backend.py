"""The ``torch`` backend: PPO-clip / GRPO with truncated importance sampling on an HF causal LM.

For response token ``t`` of a sample with advantage ``A`` (broadcast from the anchor), prompt-equal
weight ``w_t``, trainer logprob ``logp_t``, its detached copy ``old_t`` and the engine's
``rollout_t``:

    ratio_t = exp(logp_t - old_t)
    pg_t    = max(-A * ratio_t, -A * clip(ratio_t, 1 - eps_clip, 1 + eps_clip))
    tis_t   = min(exp(old_t - rollout_t), tis_cap)          (truncated importance sampling)
    L       = sum_t w_t * tis_t * pg_t

One optimizer step per formed step (the weights already normalise per step, so per-sample
backward passes simply accumulate). Each step saves ``step-XXXXXX.safetensors`` whose metadata
carries ``(run, position, step, batch_hash)``, before the log commit; resume loads the checkpoint
of the consumer's committed step. With a :class:`~dressage.training.weight_push.WeightPusher`
(``--push-to``), due steps also save a Hugging Face directory ``hf-vXXXXXX`` and push it to the
engines as policy version ``trainer_version + 1``, still before the commit (a step redone after a
crash pushes again; the version record is idempotent). torch, transformers and safetensors are
imported lazily.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dressage.errors import ConfigError, NotSupportedError, TrainingError
from dressage.store.records import ConsumerCheckpoint, Run
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


def build_model(model: str, seed: int = 0) -> Any:
    """``tiny`` (random Qwen3.5-MoE of the dev engine), ``tiny-qwen3`` (random dense Qwen3, small
    vocabulary, for tests) or a Hugging Face model directory."""
    import torch

    if model == "tiny":
        from dressage.engines.tiny_model import build_tiny_model

        return build_tiny_model(seed)
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
            f"model {model!r} is neither 'tiny', 'tiny-qwen3' nor a Hugging Face model directory"
        )
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    except (OSError, ValueError) as e:
        raise ConfigError(f"could not load a causal LM from {path}: {e}") from e


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
    ) -> None:
        if push_to is not None:
            raise NotSupportedError(
                "TorchBackend(push_to=...) cannot record policy versions (the backend has no event log); "
                "pass push=WeightPusher(store, urls) instead, as `dressage-worker train --push-to` does"
            )
        if optimizer not in ("sgd", "adam"):
            raise ConfigError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if trainable not in ("all", "lm_head"):
            raise ConfigError(f"trainable must be 'all' or 'lm_head', got {trainable!r}")
        self.optimizer_name, self.trainable = optimizer, trainable
        self.push = push
        self.out_dir = Path(out_dir)
        self.model_name, self.seed, self.lr = model, seed, lr
        self.eps_clip, self.tis_cap, self.device = eps_clip, tis_cap, device
        self.model: Any = None
        self.optimizer: Any = None
        self.run: Run | None = None

    def checkpoint_path(self, step: int) -> Path:
        """Where step ``step``'s weights go."""
        return self.out_dir / f"step-{step:06d}.safetensors"

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
        if checkpoint is not None and checkpoint.step > 0:
            path = self.checkpoint_path(checkpoint.step)
            if not path.exists():
                raise TrainingError(
                    f"the log says {checkpoint.consumer} committed step {checkpoint.step}, but {path} is "
                    "missing; restore it or train under a new --consumer name"
                )
            meta = checkpoint_metadata(path)
            if meta.get("run") != run.name or meta.get("step") != str(checkpoint.step):
                raise TrainingError(f"{path} belongs to run {meta.get('run')} step {meta.get('step')}")
            load_model(self.model, str(path), device=self.device)
        # Adam's moments are not checkpointed: a resumed trainer restarts them (SGD has no state).
        # trainable="lm_head" trains only the output projection: on a random-weight model this moves
        # token preferences without scrambling the hidden states (a demo of learning, not a recipe).
        params = [
            p for n, p in self.model.named_parameters() if self.trainable == "all" or n.startswith("lm_head.")
        ]
        for p in self.model.parameters():
            p.requires_grad_(any(p is q for q in params))
        opt_class = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.SGD
        self.optimizer = opt_class(params, lr=self.lr)

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """One optimizer step over the batch (per-sample forward/backward), then a checkpoint."""
        import torch
        from safetensors.torch import save_model

        assert self.model is not None and self.run is not None, "call resume() first"
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, stats_sum = 0.0, {"tis_mean": 0.0, "logprob_diff": 0.0}
        for s in batch.samples:
            if int(s.tokens.max()) >= vocab:
                raise TrainingError(
                    f"session {s.session_id} segment {s.segment_index} has token id {int(s.tokens.max())}, "
                    f"outside the model's vocabulary of {vocab}; train the model the run was sampled from"
                )
            tokens_L = torch.as_tensor(s.tokens, dtype=torch.long, device=self.device)
            logits_LV = self.model(input_ids=tokens_L[None]).logits[0].float()
            logp_all_TV = torch.log_softmax(logits_LV[:-1], dim=-1)
            logp_T = logp_all_TV.gather(-1, tokens_L[1:, None])[:, 0]
            logprobs_R = logp_T[-s.response_length :]
            f32, dev = torch.float32, self.device
            loss, stats = ppo_clip_tis_loss(
                logprobs_R,
                torch.as_tensor(s.rollout_log_probs, dtype=f32, device=dev),
                torch.full((s.response_length,), s.advantage, dtype=f32, device=dev),
                torch.as_tensor(s.loss_weights, dtype=f32, device=dev),
                eps_clip=self.eps_clip,
                tis_cap=self.tis_cap,
            )
            loss.backward()
            total += float(loss.detach())
            for k in stats_sum:
                stats_sum[k] += stats[k] / len(batch.samples)
        self.optimizer.step()
        meta = {
            "run": self.run.name,
            "position": str(batch.position),
            "step": str(batch.step),
            "batch_hash": batch.batch_hash,
            "policy_version": str(batch.trainer_version + 1),
            "model": json.dumps(self.model_name),
        }
        tmp = self.checkpoint_path(batch.step).with_suffix(".tmp")
        save_model(self.model, str(tmp), metadata=meta)
        tmp.replace(self.checkpoint_path(batch.step))
        metrics = {"loss": total, **stats_sum}
        if self.push is not None and self.push.due(batch.step):
            metrics.update(self._push(batch.trainer_version + 1))
        return metrics

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
