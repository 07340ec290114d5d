"""Model profiles: everything model-family specific that TITO needs, behind one interface.

A :class:`ModelProfile` bundles the tokenizer, the chat template (native renderer + hash of the
official text), special ids and the output parser. :class:`Qwen35Profile` is the first one;
other families implement the same interface and register with :func:`register_profile`.
"""

from __future__ import annotations

import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol

from dressage.errors import ConfigError
from dressage.tito.chat_template import (
    IM_END,
    IM_START,
    QWEN35_TEMPLATE_SHA256,
    RenderedConversation,
    generation_prompt,
    render_qwen35_parts,
)
from dressage.tito.render_cache import IncrementalRenderer, PromptText
from dressage.tito.tokenizer import Tokenizer, load_qwen35_tokenizer
from dressage.tito.tool_calls import ParsedAssistant, parse_assistant_text


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
        header = unicodedata.normalize("NFC", parts.header)
        return PromptText(unicodedata.normalize("NFC", parts.text), len(header))


class ModelProfile(ABC):
    """What TITO needs to know about a model family."""

    name: str
    context_window: int

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The exact tokenizer of the model."""

    @property
    @abstractmethod
    def template_hash(self) -> str:
        """sha256 of the official chat template text the renderer reproduces."""

    @property
    @abstractmethod
    def turn_start_token(self) -> str:
        """Text of the token opening a turn (``<|im_start|>`` for ChatML families)."""

    @property
    @abstractmethod
    def turn_end_token(self) -> str:
        """Text of the token closing a turn; safe split point for incremental tokenization."""

    @property
    @abstractmethod
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generation (the engine's stop ids)."""

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
        raise ConfigError(f"model profile {self.name!r} cannot force tool calls; use tool_choice 'auto'")

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


class Qwen35Profile(ModelProfile):
    """Qwen3.5 (and 3.6) chat models; ``thinking`` picks the think or no-think official template."""

    def __init__(
        self, thinking: bool = True, tokenizer: Tokenizer | None = None, context_window: int = 262_144
    ) -> None:
        """``tokenizer`` defaults to the offline-built Qwen3.5 one (loaded lazily)."""
        self.thinking = thinking
        self.name = "qwen3.5" if thinking else "qwen3.5-nothink"
        self.context_window = context_window
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_qwen35_tokenizer()
        return self._tokenizer

    @property
    def template_hash(self) -> str:
        return QWEN35_TEMPLATE_SHA256["think" if self.thinking else "nothink"]

    @property
    def turn_start_token(self) -> str:
        return IM_START

    @property
    def turn_end_token(self) -> str:
        return IM_END

    @property
    def im_start_id(self) -> int:
        """Id of ``<|im_start|>`` (248045)."""
        return self.turn_start_id

    @property
    def im_end_id(self) -> int:
        """Id of ``<|im_end|>`` (248046)."""
        return self.turn_end_id

    @cached_property
    def eos_id(self) -> int:
        """Id of ``<|endoftext|>`` (248044)."""
        return self.tokenizer.require_id("<|endoftext|>")

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.im_end_id, self.eos_id)

    def _thinking(self, enable_thinking: bool | None) -> bool:
        return self.thinking if enable_thinking is None else enable_thinking

    def render_parts(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> RenderedConversation:
        return render_qwen35_parts(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            default_thinking=self.thinking,
        )

    def prompt_renderer(self) -> PromptRenderer:
        """An :class:`IncrementalRenderer`: renders only what a request adds to earlier ones."""
        return IncrementalRenderer(default_thinking=self.thinking)

    def generation_prompt_suffix(self, enable_thinking: bool | None = None) -> str:
        return generation_prompt(self._thinking(enable_thinking))

    def forced_tool_call_prefix(self, name: str, enable_thinking: bool | None = None) -> str:
        """``<tool_call>\n<function=NAME>\n``; with thinking, an empty ``<think>`` block closes first.

        The template writes an assistant turn with empty reasoning as ``<think>\n\n</think>\n\n``
        and, without content, its first call right after: the generation prompt already holds
        ``<think>\n``, so the forced text starts with ``\n</think>\n\n``. A forced call therefore
        comes without reasoning (as with other providers, forced tool use and thinking do not mix).
        """
        opening = "<tool_call>\n<function=" + (f"{name}>\n" if name else "")
        return ("\n</think>\n\n" + opening) if self._thinking(enable_thinking) else opening

    def parse_assistant(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        seed: str | None = None,
    ) -> ParsedAssistant:
        return parse_assistant_text(text, tools=tools, think_open=self._thinking(enable_thinking), seed=seed)


_REGISTRY: dict[str, Callable[[], ModelProfile]] = {
    "qwen3.5": lambda: Qwen35Profile(thinking=True),
    "qwen3.5-nothink": lambda: Qwen35Profile(thinking=False),
}
_INSTANCES: dict[str, ModelProfile] = {}


def register_profile(name: str, factory: Callable[[], ModelProfile]) -> None:
    """Make a profile available to :func:`get_profile` under ``name``."""
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def profile_names() -> list[str]:
    """Registered profile names."""
    return sorted(_REGISTRY)


def get_profile(name: str) -> ModelProfile:
    """The (shared) profile registered as ``name``; raises :class:`ConfigError` if unknown."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model profile {name!r}; known: {', '.join(profile_names())}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
