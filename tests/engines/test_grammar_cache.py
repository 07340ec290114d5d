"""The grammar backend's disk cache of xgrammar's tokenizer info: what it reads back constrains exactly
as what xgrammar builds, a damaged file is built again, and a vocabulary without a file is never cached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_the_cached_qwen35_info_constrains_as_a_built_one() -> None:
    """Through the machine's cache (built and written by the first process that needed it, this test
    on a new machine): what reads back is what xgrammar builds, mask for mask."""
    tokenizer = ProfileTextTokenizer("qwen3.5")
    assert tokenizer.vocabulary_file is not None and tokenizer.vocabulary_file.is_file()
    _load_or_build_info(tokenizer, VOCAB, STOP)
    path = _info_cache_path(tokenizer.vocabulary_file, VOCAB, STOP)
    assert path is not None and path.is_file()
    read = _load_or_build_info(tokenizer, VOCAB, STOP)
    built = xgr.TokenizerInfo.from_huggingface(
        tokenizer.transformers_tokenizer(), vocab_size=VOCAB, stop_token_ids=list(STOP)
    )
    assert read.serialize_json() == built.serialize_json()
    assert (read.vocab_size, sorted(read.stop_token_ids)) == (VOCAB, sorted(STOP))
    built_masks, read_masks = _masks(built, TEXT, tokenizer), _masks(read, TEXT, tokenizer)
    assert len(built_masks) > 10
    assert all(torch.equal(a, b) for a, b in zip(built_masks, read_masks, strict=True))
    # another vocabulary size or other stop ids: another file
    assert path != _info_cache_path(tokenizer.vocabulary_file, VOCAB, STOP[:1])
    assert path != _info_cache_path(tokenizer.vocabulary_file, VOCAB + 64, STOP)


def _words(tmp_path: Path) -> Any:
    """A four-word tokenizer read from ``tmp_path/tokenizer.json``, naming that file as its vocabulary's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "</s>": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    return PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))


def test_a_vocabulary_file_is_cached_once_and_a_damaged_cache_file_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = _words(tmp_path)
    tokenizer.vocabulary_file = tmp_path / "tokenizer.json"
    built = _load_or_build_info(tokenizer, 4, (3,))
    files = list((tmp_path / "cache" / "xgrammar").iterdir())
    assert len(files) == 1 and files[0].read_text() == built.serialize_json()
    with monkeypatch.context() as no_builds:  # read back, not built again
        no_builds.setattr(xgr.TokenizerInfo, "from_huggingface", None)
        assert _load_or_build_info(tokenizer, 4, (3,)).serialize_json() == built.serialize_json()
    files[0].write_text('{"vocab_type": ')
    again = _load_or_build_info(tokenizer, 4, (3,))
    assert again.serialize_json() == built.serialize_json() == files[0].read_text()
    assert (again.vocab_size, again.stop_token_ids) == (4, [3])


def test_a_tokenizer_without_a_vocabulary_file_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    info = _load_or_build_info(_words(tmp_path), 4, (3,))
    assert (info.vocab_size, info.stop_token_ids) == (4, [3])
    assert not (tmp_path / "cache" / "xgrammar").exists()
