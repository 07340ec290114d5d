"""Constrained decoding for the CPU dev engine: SGLang's ``json_schema`` / ``regex`` / ``ebnf`` via xgrammar.

SGLang 0.5.23 (``sglang/srt/constrained/xgrammar_backend.py``, the default grammar backend) builds
an xgrammar ``TokenizerInfo`` from the model's tokenizer with the model's EOS ids as stop tokens,
compiles ``json_schema`` with ``compile_json_schema(any_whitespace=...)`` (``True`` unless the
server runs with ``--constrained-json-disable-any-whitespace``; the key ``$$ANY$$`` takes the
builtin JSON grammar), ``regex`` with ``compile_regex`` and ``ebnf`` with
``compile_grammar``; at most one of the three may be set. Each decoding step fills the matcher's
token bitmask and masks the logits after the penalties and before temperature, so the returned
logprobs are those of the masked distribution; the sampled token is then accepted by the matcher.
A request whose grammar has accepted a stop token is finished (``matched`` = that token).

With ``require_reasoning`` (a request field SGLang honours when the server runs a reasoning
parser) the grammar waits until the output has closed its thinking block (the tokens of
``</think>``): reasoning is free text, the answer after it is constrained.

The dev engine does the same with the same library (PyPI ``xgrammar``, pinned to the version
SGLang 0.5.23 requires), on CPU. The tokenizer info is built once, on the first constrained
request (a few seconds for the 248k-token Qwen3.5 vocabulary), and shared by every backend of
the process that serves the same vocabulary object (:func:`_tokenizer_info`); compiled grammars are
cached by each backend's compiler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dressage.engines.protocol import SamplingParams
from dressage.errors import RequestError

if TYPE_CHECKING:
    import torch

GrammarKind = Literal["json_schema", "regex", "ebnf"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "ebnf")
ANY_JSON = "$$ANY$$"
"""SGLang's ``json_schema`` value for "any JSON value" (the builtin JSON grammar)."""
THINK_END = "</think>"


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
    """Which grammar a request asks for: one of SGLang's three sampling params and its source text."""

    kind: GrammarKind
    source: str

    @classmethod
    def from_sampling(cls, params: SamplingParams) -> GrammarSpec | None:
        """The grammar in ``params``; :class:`RequestError` when more than one is set (as SGLang's ``verify``)."""
        given = [(k, getattr(params, k)) for k in GRAMMAR_KINDS if getattr(params, k) is not None]
        if len(given) > 1:
            raise RequestError("Only one of regex, json_schema, or ebnf can be set.", param=given[1][0])
        return cls(kind=given[0][0], source=given[0][1]) if given else None


class GrammarBackend:
    """Builds xgrammar's tokenizer info lazily and compiles grammars for one served model."""

    def __init__(
        self,
        tokenizer: Any | None,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        *,
        json_any_whitespace: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._any_whitespace = json_any_whitespace
        self._vocab_size = vocab_size
        self._stop_ids = list(stop_token_ids)
        self._compiler: Any = None
        self._think_end: tuple[int, ...] = ()
        self._lock = threading.Lock()

    def _ensure_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                if self._tokenizer is None:
                    raise RequestError(
                        "constrained decoding (json_schema/regex/ebnf) needs a tokenizer; this model has none",
                        param="sampling_params",
                    )
                info = _tokenizer_info(self._tokenizer, self._vocab_size, tuple(self._stop_ids))
                self._think_end = tuple(self._tokenizer.encode(THINK_END, add_special_tokens=False))
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def compile(self, spec: GrammarSpec, *, require_reasoning: bool = False) -> CompiledConstraint:
        """Compile ``spec`` (blocking: call off the event loop); an invalid grammar is a :class:`RequestError`."""
        compiler = self._ensure_compiler()
        try:
            if spec.kind == "json_schema":
                compiled = (
                    compiler.compile_builtin_json_grammar()
                    if spec.source == ANY_JSON
                    else compiler.compile_json_schema(spec.source, any_whitespace=self._any_whitespace)
                )
            elif spec.kind == "regex":
                compiled = compiler.compile_regex(spec.source)
            else:
                compiled = compiler.compile_grammar(spec.source)
        except (RuntimeError, ValueError, TypeError) as e:
            raise RequestError(f"invalid {spec.kind}: {e}", param=spec.kind) from e
        return CompiledConstraint(
            compiled=compiled,
            vocab_size=self._vocab_size,
            think_end=self._think_end if require_reasoning else (),
        )


_INFOS: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Any]] = {}
"""xgrammar ``TokenizerInfo`` by (id of the vocabulary object, vocab size, stop ids), each kept with
that object (so its id is never reused while the entry lives)."""
_INFOS_LOCK = threading.Lock()
_INFOS_MAX = 8


def _tokenizer_info(tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...]) -> Any:
    """xgrammar's ``TokenizerInfo`` of ``tokenizer``, made once per process per vocabulary.

    Building it walks the whole vocabulary (seconds for 248k tokens; :func:`_load_or_build_info`
    reads it from the disk cache where it can); it is immutable, so backends of the same vocabulary
    (a process that starts several dev engines of one profile) share it. The vocabulary object is
    ``tokenizer.vocabulary`` when the tokenizer exposes one (the dev engine's profile tokenizers
    share their profile's), else ``tokenizer`` itself.
    """
    vocabulary = getattr(tokenizer, "vocabulary", tokenizer)
    key = (id(vocabulary), vocab_size, stop_ids)
    with _INFOS_LOCK:
        found = _INFOS.get(key)
        if found is not None and found[0] is vocabulary:
            return found[1]
        info = _load_or_build_info(tokenizer, vocab_size, stop_ids)
        if len(_INFOS) >= _INFOS_MAX:
            _INFOS.pop(next(iter(_INFOS)))
        _INFOS[key] = (vocabulary, info)
        return info


def _load_or_build_info(tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...]) -> Any:
    """xgrammar's ``TokenizerInfo``, read from the disk cache when this vocabulary's is there.

    Building it takes ~2 s of CPU for Qwen3.5's 248k tokens (a ``transformers`` tokenizer around the
    vocabulary, then xgrammar's walk over every token) in each process that serves a constrained
    request; xgrammar's own serialisation reads back in ~0.25 s. The cache (under the cache root's
    ``xgrammar/``) is used only for a tokenizer that names the ``tokenizer.json`` it was parsed from
    (``vocabulary_file``: the dev engine's profile vocabularies), keyed by that file's sha256, the
    xgrammar version, the vocabulary size and the stop ids. A file that does not read back is
    built and written again.
    """
    import xgrammar as xgr

    path = _info_cache_path(getattr(tokenizer, "vocabulary_file", None), vocab_size, stop_ids)
    if path is not None and path.is_file():
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            return xgr.TokenizerInfo.deserialize_json(path.read_text(encoding="utf-8"))
    hf = getattr(tokenizer, "transformers_tokenizer", None)
    hf_tokenizer = hf() if callable(hf) else tokenizer
    info = xgr.TokenizerInfo.from_huggingface(
        hf_tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
    )
    if path is not None:
        from dressage.tito._cache import atomic_write_bytes

        atomic_write_bytes(path, info.serialize_json().encode("utf-8"))
    return info


def _info_cache_path(vocabulary_file: Path | None, vocab_size: int, stop_ids: tuple[int, ...]) -> Path | None:
    """Where the ``TokenizerInfo`` of ``vocabulary_file`` is cached (None: no file, nothing cached)."""
    if vocabulary_file is None or not vocabulary_file.is_file():
        return None
    from importlib.metadata import version

    from dressage.tito._cache import cache_subdir

    key = hashlib.sha256(vocabulary_file.read_bytes())
    key.update(f"|xgrammar {version('xgrammar')}|{vocab_size}|{list(stop_ids)}".encode())
    return cache_subdir("xgrammar") / f"tokenizer-info-{key.hexdigest()[:32]}.json"


@dataclasses.dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar ready to start a per-request :class:`GrammarState`."""

    compiled: Any  # xgrammar.CompiledGrammar
    vocab_size: int
    think_end: tuple[int, ...]

    def start(self) -> GrammarState:
        """A fresh matcher for one request."""
        import xgrammar as xgr

        return GrammarState(
            matcher=xgr.GrammarMatcher(self.compiled),
            bitmask=xgr.allocate_token_bitmask(1, self.vocab_size),
            think_end=self.think_end,
            active=not self.think_end,
        )


@dataclasses.dataclass
class GrammarState:
    """One request's grammar: masks logits before sampling and follows the sampled tokens."""

    matcher: Any  # xgrammar.GrammarMatcher
    bitmask: Any  # torch int32 [1, ceil(vocab/32)]
    think_end: tuple[int, ...]
    active: bool
    """False while the output is still reasoning (``require_reasoning`` and no ``</think>`` yet)."""
    _window: list[int] = dataclasses.field(default_factory=list)

    def mask(self, logits_V: torch.Tensor) -> None:
        """Set the logits of tokens the grammar does not allow next to ``-inf`` (in place)."""
        if not self.active:
            return
        import xgrammar as xgr

        self.matcher.fill_next_token_bitmask(self.bitmask)
        xgr.apply_token_bitmask_inplace(logits_V.unsqueeze(0), self.bitmask, vocab_size=logits_V.numel())

    def accept(self, token: int) -> None:
        """Advance past the sampled ``token`` (or watch for the end of the reasoning)."""
        if not self.active:
            self._window = [*self._window, token][-len(self.think_end) :]
            self.active = tuple(self._window) == self.think_end
            return
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask allowed")

    @property
    def terminated(self) -> bool:
        """Whether the grammar has accepted a stop token (the request is finished)."""
        return self.active and bool(self.matcher.is_terminated())
