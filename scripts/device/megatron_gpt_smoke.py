"""Device check: a tiny megatron-core GPT forward/backward on a Dressage THD-packed batch.

With a GPU (and Transformer Engine, which Megatron's THD attention needs) it builds a 2-layer GPT
(hidden 64, 4 heads; ``--moe`` adds 8 experts top-2), packs synthetic samples with
:func:`dressage.training.megatron_pack.pack_megatron` (``PackedSeqParams``, ``qkv_format="thd"``),
runs forward with ``packed_seq_params`` and backward on the prompt-equal weighted token loss, and
checks that the loss is finite and every parameter got a gradient.

On a CPU-only machine it prints that it needs a GPU and exits 0, after checking what the CPU allows:
megatron-core imports, the packed batch builds, and the same GPT model is constructed with
``use_cpu_initialization=True`` (no THD attention is run).

    python scripts/device/megatron_gpt_smoke.py [--moe] [--samples 6] [--tp-pad 128]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

VOCAB = 1024


def synthetic_samples(n: int, seed: int = 0) -> list[Any]:
    """``n`` TrainSamples of 40..200 tokens with weights, advantages and [L-1, 2, 2] routed experts."""
    from dressage.training.samples import TrainSample
    from dressage.training.weights import assign_loss_weights

    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        length = int(rng.integers(40, 200))
        resp = int(rng.integers(8, length - 8))
        samples.append(
            TrainSample(
                tokens=rng.integers(0, VOCAB, length).astype(np.int32),
                response_length=resp,
                loss_mask=(rng.random(resp) < 0.8).astype(np.int32),
                rollout_log_probs=-rng.random(resp).astype(np.float32),
                rollout_routed_experts=rng.integers(0, 8, (length - 1, 2, 2)).astype(np.int32),
                reward=float(i % 2),
                status="completed",
                index=i,
                group_index=i // 2,
                rollout_id=i,
                session_id=f"s{i}",
                segment_index=0,
                thread_index=0,
                is_anchor=True,
                turn_ids=[],
                policy_versions=np.zeros(resp, np.int32),
                stored_loss_mask=np.ones(resp, np.bool_),
                advantage=0.5 if i % 2 else -0.5,
            )
        )
    assign_loss_weights(samples)
    return samples


def init_distributed(backend: str) -> None:
    """A single-process process group and Megatron's model-parallel state (TP = PP = 1)."""
    import torch
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend, rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def build_gpt(moe: bool, *, cpu: bool, te: bool) -> Any:
    """The tiny GPTModel (2 layers, hidden 64, 4 heads; MoE 8 experts top-2 when asked)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    kwargs: dict[str, Any] = {}
    if moe:
        kwargs = {"num_moe_experts": 8, "moe_router_topk": 2, "moe_token_dispatcher_type": "alltoall"}
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=cpu,
        params_dtype=torch.float32 if cpu else torch.bfloat16,
        bf16=not cpu,
        **kwargs,
    )
    if te:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=8 if moe else None)
    else:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        spec = get_gpt_layer_local_spec(num_experts=8 if moe else None)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=4096,
        position_embedding_type="rope",
    )


def gpu_run(args: argparse.Namespace) -> int:
    """Forward/backward with PackedSeqParams on the GPU; 0 when the loss is finite and grads flow."""
    import torch
    from megatron.core import tensor_parallel

    from dressage.training.megatron_pack import pack_megatron

    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        print(
            "megatron-core's THD attention needs transformer-engine: pip install transformer-engine[pytorch]"
        )
        return 2
    init_distributed("nccl")
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = build_gpt(args.moe, cpu=False, te=True).cuda()
    batch = pack_megatron(synthetic_samples(args.samples), pad_multiplier=args.tp_pad, device="cuda")
    params = batch.packed_seq_params
    print(
        f"packed {len(batch.starts)} samples into T={batch.num_tokens}, cu_seqlens={params.cu_seqlens_q.tolist()}"
    )
    # per-token cross entropy [1, T] of labels; the prompt-equal weights make the step loss
    per_token = model(
        input_ids=batch.tokens_1T,
        position_ids=batch.position_ids_1T,
        attention_mask=None,
        labels=batch.labels_1T,
        packed_seq_params=params,
    )
    loss = (per_token.float() * batch.loss_weights_1T).sum()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    print(f"loss={float(loss):.4f} per_token.shape={tuple(per_token.shape)} params without grad: {missing}")
    ok = bool(torch.isfinite(loss)) and not missing and tuple(per_token.shape) == (1, batch.num_tokens)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def cpu_check(args: argparse.Namespace) -> None:
    """What the CPU allows: the packed batch and the model's construction (no THD attention)."""
    from dressage.training.megatron_pack import pack_megatron

    batch = pack_megatron(synthetic_samples(args.samples), pad_multiplier=args.tp_pad)
    print(
        f"cpu: packed {len(batch.starts)} samples into T={batch.num_tokens} "
        f"(cu_seqlens {batch.packed_seq_params.cu_seqlens_q.tolist()})"
    )
    try:
        init_distributed("gloo")
        model = build_gpt(args.moe, cpu=True, te=False)
        n = sum(p.numel() for p in model.parameters())
        print(
            f"cpu: built megatron-core GPTModel ({n:,} parameters, moe={args.moe}) with use_cpu_initialization"
        )
    except Exception as e:  # a report of what the CPU could not do, never a failure
        print(f"cpu: model construction not possible here: {type(e).__name__}: {e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe", action="store_true", help="8 experts, top-2")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--tp-pad", type=int, default=128, help="pad multiple (tp_size x 128 in slime)")
    args = ap.parse_args()
    import torch

    if torch.cuda.is_available():
        return gpu_run(args)
    cpu_check(args)
    print("megatron_gpt_smoke needs a GPU for the THD forward/backward; skipped (exit 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
