"""Models for the CPU dev engine: tiny random models per family, any HF causal LM, router capture.

The ``tiny`` model has the real Qwen3.5 architecture (one Gated DeltaNet linear-attention layer,
one full-attention layer, a sparse MoE in every layer) and the real vocabulary size, so token ids
from the Qwen3.5 tokenizer are valid and routed-experts capture has the production shape, but it
is small enough to build in well under a second and run token by token on one core. One tiny
model per other model profile (:data:`TINY_MODELS`: ``tiny-qwen3.6``, ``tiny-deepseek-v3``,
``tiny-mistral-nemo``) has that family's architecture from ``transformers`` and its vocabulary
size, so ``dressage-worker loop`` runs on every profile.

``torch`` and ``transformers`` are imported lazily so that importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dressage.errors import ConfigError, EngineError

QWEN3_5_VOCAB_SIZE = 248320
"""``vocab_size`` of the official Qwen3.5 configs (covers every tokenizer id up to 248076)."""

QWEN3_5_EOS_IDS = (248046, 248044)
"""``<|im_end|>`` and ``<|endoftext|>``: default stop tokens of the dev engine."""


@dataclasses.dataclass
class LoadedModel:
    """A causal LM ready for token-by-token generation, plus what the engine reports about it."""

    model: Any  # transformers PreTrainedModel
    model_path: str
    tokenizer: Any | None
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_context: int
    model_type: str | None
    num_experts: int | None
    top_k: int | None


def _tiny_qwen3_5_layout() -> dict[str, Any]:
    """The config fields the tiny Qwen3.5 family models share: the real vocabulary and stop ids, and
    one Gated DeltaNet linear-attention layer then one full-attention layer, all at hidden size 64.

    A fresh dict each call, so a caller may add its own fields (the MoE's experts, the dense MLP).
    """
    return dict(
        vocab_size=QWEN3_5_VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        max_position_embeddings=32768,
        eos_token_id=list(QWEN3_5_EOS_IDS),
    )


def tiny_qwen3_5_moe_config() -> Any:
    """The ``Qwen3_5MoeTextConfig`` of the ``tiny`` model (hidden 64, 2 layers, 8 experts, top-2)."""
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(
        **_tiny_qwen3_5_layout(),
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        architectures=["Qwen3_5MoeForCausalLM"],
    )


def quiet_transformers() -> None:
    """Silence what transformers prints on every CPU run and that no user can act on: the warning that a
    kernel falls back to its reference PyTorch implementation (the optional CUDA kernel packages are not
    installed on a CPU machine, by design) and the "Writing model shards" bar of each weight push."""
    import logging

    from transformers.utils import logging as hf_logging

    logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()


def build_tiny_model(seed: int = 0, model: str = "tiny") -> Any:
    """A random-weight tiny model of ``model``'s family (see :data:`TINY_MODELS`), identical for
    identical ``seed``; ``tiny`` is the Qwen3.5-MoE of the quickstart."""
    import torch

    quiet_transformers()
    if model not in TINY_MODELS:
        raise ConfigError(f"unknown tiny model {model!r}; known: {', '.join(sorted(TINY_MODELS))}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = _TINY_BUILDERS[model]()
    return lm.eval()


def _tiny_qwen35_moe() -> Any:
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    return Qwen3_5MoeForCausalLM(tiny_qwen3_5_moe_config())


def _tiny_qwen36_dense() -> Any:
    """Qwen3.6-27B's architecture (dense Qwen3.5: Gated DeltaNet + full attention), shrunk."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**_tiny_qwen3_5_layout(), intermediate_size=128)
    return Qwen3_5ForCausalLM(config)


def _tiny_deepseek_v3() -> Any:
    """DeepSeek-V3's architecture (MLA attention, one dense then one MoE layer), shrunk."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=129_280,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=32768,
        bos_token_id=0,
        eos_token_id=1,
    )
    return DeepseekV3ForCausalLM(config)


def _tiny_mistral_nemo() -> Any:
    """Mistral NeMo's architecture (dense Mistral, 131072 Tekken ids), shrunk."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=131_072,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=32768,
        sliding_window=None,
        bos_token_id=1,
        eos_token_id=2,
    )
    return MistralForCausalLM(config)


TINY_MODELS: dict[str, str] = {
    "tiny": "qwen3.5",
    "tiny-qwen3.6": "qwen3.6",
    "tiny-deepseek-v3": "deepseek-v3",
    "tiny-mistral-nemo": "mistral-nemo",
}
"""Tiny random-weight models of the dev engine -> the model profile whose vocabulary they use."""

_TINY_BUILDERS = {
    "tiny": _tiny_qwen35_moe,
    "tiny-qwen3.6": _tiny_qwen36_dense,
    "tiny-deepseek-v3": _tiny_deepseek_v3,
    "tiny-mistral-nemo": _tiny_mistral_nemo,
}


def tiny_model_profile(model: str) -> str | None:
    """The model profile of tiny model ``model`` (``None`` when ``model`` is not a tiny model)."""
    return TINY_MODELS.get(model)


class ProfileTextTokenizer:
    """A model profile's vocabulary as the engine's text tokenizer (tiny models use its ids).

    Lets the dev engine take ``text`` prompts and stop strings like SGLang does with a real model.
    """

    def __init__(self, profile: str = "qwen3.5") -> None:
        """Load the profile's tokenizer (built offline and cached under ``~/.cache/dressage``)."""
        from dressage.tito.profiles import get_profile

        tokenizer = get_profile(profile).tokenizer
        self._hf = tokenizer.hf
        self.vocabulary_file: Path | None = tokenizer.source
        """The ``tokenizer.json`` this vocabulary was parsed from (keys the grammar backend's disk cache)."""

    @property
    def vocabulary(self) -> Any:
        """The profile's shared HF tokenizer: what identifies this vocabulary (the grammar backend
        builds xgrammar's tokenizer info once per vocabulary and process)."""
        return self._hf

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` (special tokens written in it become their ids)."""
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        return str(self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def transformers_tokenizer(self) -> Any:
        """The same vocabulary as a ``transformers`` fast tokenizer (what xgrammar's ``from_huggingface`` reads)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self._hf)


def load_model(model: str, seed: int = 0) -> LoadedModel:
    """Load a tiny model (``tiny``, ``tiny-qwen3.6``, ... built from ``seed``) or an HF model directory."""
    if model in TINY_MODELS:
        lm = build_tiny_model(seed, model)
        return _describe(lm, model, tokenizer=ProfileTextTokenizer(TINY_MODELS[model]))
    path = Path(model)
    if not path.is_dir():
        raise ConfigError(
            f"model {model!r} is neither a tiny model ({', '.join(sorted(TINY_MODELS))}) nor a Hugging Face model directory"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    try:
        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32").eval()
    except (OSError, ValueError) as e:
        raise ConfigError(f"could not load a causal LM from {path}: {e}") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError):
        tokenizer = None  # ids in, ids out: a tokenizer is only needed for text and stop strings
    return _describe(lm, str(path), tokenizer=tokenizer)


def _describe(lm: Any, model_path: str, tokenizer: Any | None) -> LoadedModel:
    config = lm.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    eos = getattr(text_config, "eos_token_id", None) or getattr(config, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, list | tuple) else ((eos,) if eos is not None else ())
    if model_path in TINY_MODELS:
        from dressage.tito.profiles import get_profile

        eos_ids = tuple(dict.fromkeys((*eos_ids, *get_profile(TINY_MODELS[model_path]).stop_token_ids)))
    elif getattr(text_config, "model_type", "").startswith("qwen3_5"):
        eos_ids = tuple(dict.fromkeys((*eos_ids, *QWEN3_5_EOS_IDS)))
    return LoadedModel(
        model=lm,
        model_path=model_path,
        tokenizer=tokenizer,
        vocab_size=int(text_config.vocab_size),
        eos_token_ids=eos_ids,
        max_context=int(getattr(text_config, "max_position_embeddings", 32768)),
        model_type=getattr(text_config, "model_type", None),
        num_experts=getattr(text_config, "num_experts", None),
        top_k=getattr(text_config, "num_experts_per_tok", None),
    )


class RouterCapture:
    """Forward hooks on every MoE router that record the top-k expert ids per token per layer.

    Routers are found by class name (``*TopKRouter``, the transformers 5 MoE router returning
    ``(logits, scores, indices)``). While :meth:`recording` is active, each forward appends one
    ``[tokens, layers, top_k]`` int32 block to the target list.
    """

    def __init__(self, model: Any) -> None:
        self.routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        self._target: list[Any] | None = None
        self._layer_blocks: list[Any] = []
        for router in self.routers:
            router.register_forward_hook(self._hook)

    @property
    def supported(self) -> bool:
        """Whether the model has routers to capture."""
        return bool(self.routers)

    @property
    def num_layers(self) -> int:
        """How many MoE layers the capture covers."""
        return len(self.routers)

    def _hook(self, module: object, inputs: object, output: Any) -> None:
        if self._target is None:
            return
        indices = output[-1] if isinstance(output, tuple) else output
        self._layer_blocks.append(indices.detach().to("cpu").int().reshape(-1, indices.shape[-1]))

    def begin(self, target: list[Any] | None) -> None:
        """Start recording one forward pass into ``target`` (``None``: record nothing)."""
        self._target = target
        self._layer_blocks = []

    def end(self) -> None:
        """Finish the forward pass: stack the per-layer blocks into ``[tokens, layers, top_k]``."""
        import torch

        if self._target is not None and self._layer_blocks:
            if len(self._layer_blocks) != len(self.routers):
                raise EngineError(
                    f"router capture saw {len(self._layer_blocks)} router calls for "
                    f"{len(self.routers)} routers in one forward; the model calls its routers in an unexpected way"
                )
            self._target.append(torch.stack(self._layer_blocks, dim=1).numpy())
        self._target = None
        self._layer_blocks = []


def load_weights_from_disk(model: Any, model_path: str) -> int:
    """Copy the weights at ``model_path`` into ``model``; return the number of tensors loaded.

    An HF directory (with ``config.json``) is loaded with ``from_pretrained`` so transformers'
    checkpoint-format conversions apply (e.g. per-expert MoE tensors fused on load); a bare
    ``.safetensors`` file or a directory of them is read as-is. Every model parameter must be
    present with the same shape, so a wrong checkpoint fails loudly instead of half-loading.
    """
    import torch

    path = Path(model_path)
    if path.is_dir() and (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        try:
            source = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
        except (OSError, ValueError) as e:
            raise EngineError(f"could not load weights from {model_path}: {e}") from e
        state = source.state_dict()
    else:
        from safetensors.torch import load_file

        files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
        if not files:
            raise EngineError(f"no model at {model_path}; pass an HF model directory or .safetensors file(s)")
        state = {}
        for file in files:
            state.update(load_file(str(file)))
    own = model.state_dict()
    missing = [k for k in own if k not in state and not _is_tied(model, k)]
    mismatched = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if missing or mismatched:
        raise EngineError(
            f"weights at {model_path} do not fit the served model: missing {missing[:5]}, "
            f"shape mismatch {mismatched[:5]}; pass a checkpoint of the same architecture"
        )
    with torch.no_grad():
        for key, tensor in state.items():
            if key in own:
                own[key].copy_(tensor)
    return sum(1 for k in state if k in own)


def _is_tied(model: Any, key: str) -> bool:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return key in tied
