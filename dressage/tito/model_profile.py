"""The model profile interface: :class:`ModelProfile` and the prompt renderers it hands out.

A :class:`ModelProfile` bundles the tokenizer, the chat template (native renderer + sha256 of the
official text), the thinking switch, the tool-call format (parse generated calls, render them
back), stop tokens, the context window and where incremental tokenization may split. The concrete
families (:mod:`dressage.tito.qwen_profile`, :mod:`dressage.tito.deepseek_profile`,
:mod:`dressage.tito.mistral_profile`) subclass it here; the registry that names them is
:mod:`dressage.tito.profiles`, which imports them lazily (so nothing imports in a circle).
"""

from __future__ import annotations

import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol

from dressage.errors import RequestError
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
        tools: Sequence[Mapping[str, object]] | None = None,
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

    def forced_tool_call_grammar(self, names: Sequence[str]) -> str | None:
        """EBNF for the answer after a thinking block when a tool call is forced (``None``: none).

        With thinking on, SGLang and vLLM force ``tool_choice`` required / named with a grammar that
        applies once the reasoning closes (``require_reasoning``), so the model thinks first and
        then must call one of ``names``. A profile without such a grammar closes the thinking block
        empty and writes :meth:`forced_tool_call_prefix` instead.
        """
        return None

    def think_open(
        self, enable_thinking: bool | None = None, messages: Sequence[object] | None = None
    ) -> bool:
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

    @staticmethod
    def think_block_dropped(old: str, new: str, at: int, assistant_opener: str) -> bool:
        """For templates that open an assistant turn with ``assistant_opener``: the assistant turn
        around ``at`` began with ``<think>`` in ``old`` but not in ``new``."""
        start = old.rfind(assistant_opener, 0, at + 1)
        if start < 0:
            return False
        body = start + len(assistant_opener)
        return old.startswith("<think>", body) and not new.startswith("<think>", body)

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
