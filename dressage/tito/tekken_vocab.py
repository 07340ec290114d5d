"""Build a Hugging Face ``tokenizer.json`` from a Mistral Tekken vocabulary (``mistral-common``).

``mistral-common`` ships Tekken files (``data/tekken_*.json``): tiktoken-style BPE ranks (base64
bytes, rank), the split pattern, and the number of special (control) tokens, which take ids
``0 .. num_special - 1``; BPE token ``rank`` has id ``num_special + rank``, and only the first
``default_vocab_size - num_special`` ranks are used. As for Qwen (:mod:`dressage.tito.qwen35_vocab`)
the merges are derived by running BPE over each token's bytes with lower ranks. The control
tokens (``<s>``, ``[INST]``, ``[TOOL_CALLS]`` ...) become special added tokens with their exact
ids, so text that writes them encodes to their single ids, as the Mistral encoder places them.
Tekken does no normalisation. The built file is cached, keyed by the Tekken file's sha256.
"""

from __future__ import annotations

import base64
import hashlib
import json
from importlib import resources
from pathlib import Path

from dressage.errors import TokenizationError
from dressage.tito._cache import atomic_write_bytes, cache_subdir
from dressage.tito.qwen35_vocab import _bytes_to_unicode, _split_in_two

_BUILD_VERSION = "2"


def tekken_file(name: str) -> Path:
    """Path of ``data/<name>`` inside the installed ``mistral-common`` package."""
    try:
        path = Path(str(resources.files("mistral_common") / "data" / name))
    except ModuleNotFoundError as e:
        raise TokenizationError(
            "package mistral-common is not installed; pip install 'mistral-common>=1.13'"
        ) from e
    if not path.is_file():
        raise TokenizationError(f"{path} is missing; reinstall mistral-common>=1.13")
    return path


def control_tokens(path: Path) -> list[str]:
    """The control-token strings by id, as ``mistral-common``'s Tekkenizer names them."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tek = Tekkenizer.from_file(path)
    return [tek.id_to_piece(i) for i in range(tek.num_special_tokens)]


def build_tekken_tokenizer_json(path: Path) -> str:
    """The ``tokenizer.json`` text for the Tekken file at ``path``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    cfg = data["config"]
    n_special = int(cfg["default_num_special_tokens"])
    n_ranks = int(cfg["default_vocab_size"]) - n_special
    ranks = {base64.b64decode(t["token_bytes"]): int(t["rank"]) for t in data["vocab"][:n_ranks]}
    b2u = _bytes_to_unicode()

    def show(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {show(tok): rank + n_special for tok, rank in ranks.items()}
    merges: list[list[str]] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) >= 2:
            pair = _split_in_two(tok, ranks, rank)
            if pair is not None:
                merges.append([show(pair[0]), show(pair[1])])
    controls = control_tokens(path)
    clash = [text for text in controls if text in vocab]
    if clash:
        raise TokenizationError(f"{path.name}: control tokens {clash[:3]} are also BPE tokens")
    vocab.update({text: i for i, text in enumerate(controls)})  # added tokens keep ids found in the vocab
    added: list[dict[str, object]] = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for i, text in enumerate(controls)
    ]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": cfg["pattern"]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def tekken_tokenizer_json(name: str) -> Path:
    """Path of the cached ``tokenizer.json`` for ``mistral-common``'s ``data/<name>``, built when absent."""
    src = tekken_file(name)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    out = cache_subdir("tokenizers") / f"{Path(name).stem}-{digest}-v{_BUILD_VERSION}.json"
    if not out.is_file():
        atomic_write_bytes(out, build_tekken_tokenizer_json(src).encode("utf-8"))
    return out
