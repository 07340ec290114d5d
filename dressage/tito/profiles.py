"""Model profiles: everything model-family specific that TITO needs, behind one interface.

A :class:`ModelProfile` bundles the tokenizer, the chat template (native renderer + sha256 of the
official text), the thinking switch, the tool-call format (parse generated calls, render them
back), stop tokens, the context window and where incremental tokenization may split. The
families live in their own modules (:mod:`dressage.tito.qwen_profile`,
:mod:`dressage.tito.deepseek_profile`, :mod:`dressage.tito.mistral_profile`) and are registered
here by name, imported only when first asked for; others register with :func:`register_profile`.
"""

from __future__ import annotations

import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol

from dressage.errors import ConfigError, RequestError
from dressage.tito.chat_template import RenderedConversation
from dressage.tito.render_cache import PromptText
from dressage.tito.tokenizer import Tokenizer
from dressage.tito.tool_calls import ParsedAssistant


class PromptRenderer(Protocol):
    """Renders requests of one session to NFC prompt text (may reuse earlier renderings)."""

    def render(
        self, messages: Sequence[Any], tools: Sequence[Any] | None, enable_thinking: bool | None
    ) -> PromptText:
        """The NFC prompt text (with the generation prompt) and its header length."""
        ...


class FullRenderer:
    """A :class:`PromptRenderer` that renders the whole conversation every time."""

    def __init__(self, profile: ModelProfile) -> None:
        """Render with ``profile``'s :meth:`ModelProfile.render_parts`."""
        self.profile = profile

    def render(
        self, messages: Sequence[Any], tools: Sequence[Any] | None, enable_thinking: bool | None
    ) -> PromptText:
        """The NFC prompt text and its header length."""
        parts = self.profile.render_parts(messages, tools, True, enable_thinking)
        if not self.profile.normalizes_nfc:
            return PromptText(parts.text, len(parts.header))
        header = unicodedata.normalize("NFC", parts.header)
        return PromptText(unicodedata.normalize("NFC", parts.text), len(header))


class ModelProfile(ABC):
    """What TITO needs to know about a model family."""

    name: str
    context_window: int
    normalizes_nfc: bool = False
    """Whether the tokenizer NFC-normalises text (the prompt text is then kept in NFC too)."""
    has_reasoning: bool = False
    """Whether the model writes ``<think>...</think>`` reasoning (see :meth:`split_reasoning`)."""

    turn_start_token: str
    """Text of the token opening a turn (``<|im_start|>`` for ChatML families)."""
    turn_end_token: str
    """Text of the token closing a turn; safe split point for incremental tokenization."""
    tool_call_marker: str | None = None
    """Text that opens generated tool calls (streaming holds everything from it back)."""

    def __init__(self, tokenizer: Tokenizer | None = None, context_window: int = 131_072) -> None:
        """``tokenizer`` defaults to the family's own vocabulary (:meth:`load_tokenizer`, lazily)."""
        self.context_window = context_window
        self._tokenizer = tokenizer

    @abstractmethod
    def load_tokenizer(self) -> Tokenizer:
        """Build the family's exact tokenizer (called once, on first use)."""

    @property
    def tokenizer(self) -> Tokenizer:
        """The exact tokenizer of the model."""
        if self._tokenizer is None:
            self._tokenizer = self.load_tokenizer()
        return self._tokenizer

    @property
    @abstractmethod
    def template_hash(self) -> str:
        """sha256 of the official chat template text the renderer reproduces."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generation (the engine's stop ids): the turn's end token by default."""
        return (self.turn_end_id,)

    @abstractmethod
    def render_parts(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> RenderedConversation:
        """Render a conversation, split into header / per-message / suffix parts."""

    @abstractmethod
    def generation_prompt_suffix(self, enable_thinking: bool | None = None) -> str:
        """Text appended by ``add_generation_prompt`` (the start of the model's turn)."""

    @abstractmethod
    def parse_assistant(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        seed: str | None = None,
    ) -> ParsedAssistant:
        """Split generated text into reasoning, content and tool calls (never raises)."""

    def forced_tool_call_prefix(self, name: str, enable_thinking: bool | None = None) -> str:
        """Text that opens a tool call at the start of the model's turn (after the generation prompt).

        Used for ``tool_choice`` required / named: the engine continues from it. ``name`` ``""``
        leaves the function name to the model. The text must be what the chat template writes for
        an assistant turn that only calls tools, so the forced turn re-renders exactly.
        """
        raise RequestError(
            f"model profile {self.name!r} cannot force tool calls; use tool_choice 'auto'",
            param="tool_choice",
        )

    def think_open(self, enable_thinking: bool | None = None, messages: Sequence[Any] | None = None) -> bool:
        """Whether the generation prompt of a request with ``messages`` opens a reasoning block
        (the model starts by thinking)."""
        return False

    def split_reasoning(self, text: str, think_open: bool) -> tuple[str | None, str]:
        """(reasoning, rest) of generated text; families without reasoning return ``(None, text)``."""
        return None, text

    def first_turn_end(self, text: str, header_len: int) -> int:
        """Where the first turn after the header (system part) ends in ``text`` (-1 if it does not):
        a rendering that leaves a segment before it is a new conversation, not an edited one."""
        end = text.find(self.turn_end_token, header_len)
        return end + len(self.turn_end_token) if end >= 0 else -1

    def reasoning_dropped(self, old: str, new: str, at: int) -> bool:
        """Whether a rendering ``new`` that leaves ``old`` at ``at`` did so because the template
        dropped an earlier turn's reasoning (boundary reason ``think_stripped``)."""
        return False

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> str:
        """Render a conversation to the exact prompt text."""
        return self.render_parts(messages, tools, add_generation_prompt, enable_thinking).text

    def prompt_renderer(self) -> PromptRenderer:
        """A renderer for one session's requests (default: renders everything each time)."""
        return FullRenderer(self)

    @cached_property
    def turn_end_id(self) -> int:
        """Id of :attr:`turn_end_token`."""
        return self.tokenizer.require_id(self.turn_end_token)

    @cached_property
    def turn_start_id(self) -> int:
        """Id of :attr:`turn_start_token`."""
        return self.tokenizer.require_id(self.turn_start_token)


def _qwen(name: str) -> ModelProfile:
    from dressage.tito.qwen_profile import Qwen35Profile, Qwen36Profile

    if name.startswith("qwen3.6"):
        return Qwen36Profile(preserve_thinking=name.endswith("-preserve"))
    return Qwen35Profile(thinking=not name.endswith("-nothink"))


def _deepseek() -> ModelProfile:
    from dressage.tito.deepseek_profile import DeepSeekV3Profile

    return DeepSeekV3Profile()


def _mistral() -> ModelProfile:
    from dressage.tito.mistral_profile import MistralNemoProfile

    return MistralNemoProfile()


_REGISTRY: dict[str, Callable[[], ModelProfile]] = {
    "qwen3.5": lambda: _qwen("qwen3.5"),
    "qwen3.5-nothink": lambda: _qwen("qwen3.5-nothink"),
    "qwen3.6": lambda: _qwen("qwen3.6"),
    "qwen3.6-preserve": lambda: _qwen("qwen3.6-preserve"),
    "deepseek-v3": _deepseek,
    "mistral-nemo": _mistral,
}
_INSTANCES: dict[str, ModelProfile] = {}


RUN_RECORD_KEY = "tito"
"""Key of a run's config snapshot under which the proxy records the model profile it served."""


def profile_record(profile: ModelProfile) -> dict[str, str]:
    """What a run records about the profile that rendered its prompts: name and template sha256."""
    return {"model_profile": profile.name, "template_sha256": profile.template_hash}


def check_run_profile(run_name: str, config: Mapping[str, Any], profile: ModelProfile) -> None:
    """Refuse to serve run ``run_name`` with ``profile`` when its config recorded another one.

    A run's token ids only mean something under the template and vocabulary that produced them;
    a proxy restarted with another profile must not continue it. Runs without a record (created
    outside a proxy) are accepted.
    """
    recorded = config.get(RUN_RECORD_KEY)
    if recorded is None or recorded == profile_record(profile):
        return
    name = recorded.get("model_profile") if isinstance(recorded, Mapping) else recorded
    raise ConfigError(
        f"run {run_name!r} was recorded with model profile {name!r} ({recorded}); this proxy serves "
        f"{profile.name!r} (template sha256 {profile.template_hash}): restart it with --profile {name}"
    )


def register_profile(name: str, factory: Callable[[], ModelProfile]) -> None:
    """Make a profile available to :func:`get_profile` under ``name``."""
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def profile_names() -> list[str]:
    """Registered profile names."""
    return sorted(_REGISTRY)


def build_profile(name: str) -> ModelProfile:
    """A new, unshared instance of the profile registered as ``name`` (loads its tokenizer anew)."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model profile {name!r}; known: {', '.join(profile_names())}")
    return _REGISTRY[name]()


def get_profile(name: str) -> ModelProfile:
    """The (shared) profile registered as ``name``; raises :class:`ConfigError` if unknown."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model profile {name!r}; known: {', '.join(profile_names())}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
