"""The grammar backend's disk cache of xgrammar's tokenizer info: what it reads back constrains exactly
as what it builds, a damaged file is built again, and a vocabulary without a file is never cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ENGINE_EXTRA, require_module

torch = require_module("torch", ENGINE_EXTRA)
xgr = require_module("xgrammar", ENGINE_EXTRA)

from dressage.engines.grammar import _info_cache_path, _load_or_build_info  # noqa: E402
from dressage.engines.tiny_model import ProfileTextTokenizer  # noqa: E402

VOCAB = 248_320
STOP = (248046, 248044)
TEXT = 'Call <tool_call>{"name": "run", "arguments": {"cmd": "ls -la /tmp"}}</tool_call> done.'


def _masks(info: object, text: str, tokenizer: ProfileTextTokenizer) -> list[torch.Tensor]:
    """The token bitmask before each token of ``text`` under a regex that admits exactly ``text``."""
    from recipes.forcing import literal_regex

    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info, max_threads=1).compile_regex(literal_regex(text)))
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    masks = []
    for token in tokenizer.encode(text):
        matcher.fill_next_token_bitmask(bitmask)
        masks.append(bitmask.clone())
        assert matcher.accept_token(token)
    return masks


def test_the_cached_info_constrains_as_the_built_one_and_a_damaged_file_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = ProfileTextTokenizer("qwen3.5")  # from the real cache: only xgrammar's goes to tmp_path
    assert tokenizer.vocabulary_file is not None and tokenizer.vocabulary_file.is_file()
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path))

    built = _load_or_build_info(tokenizer, VOCAB, STOP)
    files = list((tmp_path / "xgrammar").iterdir())
    assert len(files) == 1, files
    read = _load_or_build_info(tokenizer, VOCAB, STOP)
    serialized = built.serialize_json()
    assert read is not built and read.serialize_json() == serialized
    assert (read.vocab_size, sorted(read.stop_token_ids)) == (VOCAB, sorted(STOP))
    built_masks, read_masks = _masks(built, TEXT, tokenizer), _masks(read, TEXT, tokenizer)
    assert len(built_masks) > 10
    assert all(torch.equal(a, b) for a, b in zip(built_masks, read_masks, strict=True))

    # another vocabulary size or other stop ids: another file; a damaged file: built and written again
    assert files[0] == _info_cache_path(tokenizer.vocabulary_file, VOCAB, STOP)
    assert files[0] != _info_cache_path(tokenizer.vocabulary_file, VOCAB, STOP[:1])
    assert files[0] != _info_cache_path(tokenizer.vocabulary_file, VOCAB + 64, STOP)
    files[0].write_text('{"vocab_type": ')
    again = _load_or_build_info(tokenizer, VOCAB, STOP)
    assert again.serialize_json() == serialized and files[0].read_text() == serialized


def test_a_tokenizer_without_a_vocabulary_file_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "</s>": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path))
    info = _load_or_build_info(PreTrainedTokenizerFast(tokenizer_object=words), 4, (3,))
    assert (info.vocab_size, info.stop_token_ids) == (4, [3])
    assert not (tmp_path / "xgrammar").exists()
