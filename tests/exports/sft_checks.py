"""TRL's SFT dataset preparation over an ``sft.parquet`` (shared by the export and quickstart tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dressage.exports.sft import SFT_FILE
from dressage.tito.model_profile import ModelProfile
from dressage.tito.official_templates import official_qwen35_template


def trl_prepare(rows_dir: Path, profile: ModelProfile, tmp_path: Path) -> list[dict[str, Any]]:
    """``sft.parquet`` through TRL's ``SFTTrainer`` dataset preparation (tokenizer: the profile's
    vocabulary with the official template from the pinned trl wheel; a tiny random model)."""
    trl = pytest.importorskip("trl", reason="install the test extra (trl==1.16.0)")
    datasets = pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=profile.tokenizer.hf,
        chat_template=official_qwen35_template("think"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    config = transformers.Qwen2Config(
        vocab_size=profile.tokenizer.vocab_size,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    model = transformers.Qwen2ForCausalLM(config)
    dataset = datasets.load_dataset("parquet", data_files=str(rows_dir / SFT_FILE), split="train")
    args = trl.SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, max_length=None)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return list(trainer.train_dataset)


def assert_trl_tokenizes_exact_rows(export_dir: Path, profile: ModelProfile, tmp_path: Path) -> int:
    """TRL's ids equal ``token_ids + template_tail_ids`` for every exact row and differ for every
    flagged one; returns the number of exact rows."""
    import pyarrow.parquet as pq

    rows = pq.read_table(export_dir / SFT_FILE).to_pylist()
    prepared = trl_prepare(export_dir, profile, tmp_path)
    assert len(prepared) == len(rows)
    for row, got in zip(rows, prepared, strict=True):
        same = got["input_ids"] == row["token_ids"] + row["template_tail_ids"]
        assert same == row["exact"], (row["session_id"], row["mismatch_reason"])
    return sum(1 for r in rows if r["exact"])
