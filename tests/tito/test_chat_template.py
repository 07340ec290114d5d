"""The native Qwen3.5 renderer is byte-identical to the official jinja templates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2
import pytest

from dressage.errors import TemplateError
from dressage.tito.chat_template import (
    QWEN35_TEMPLATE_SHA256,
    normalize_messages,
    render_qwen35,
    render_qwen35_parts,
)
from dressage.tito.official_templates import template_sha256
from tests.tito.corpus import CONVERSATIONS, TOOLS

VARIANTS = {"think": True, "nothink": False}


def test_official_hashes_match(official_templates: dict[str, str]) -> None:
    for variant, text in official_templates.items():
        assert template_sha256(text) == QWEN35_TEMPLATE_SHA256[variant]


@pytest.mark.parametrize("name,messages,tools", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_renderer_matches_official(
    jinja_render: Callable[..., str],
    name: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> None:
    normalized = normalize_messages(messages)
    for variant, default in VARIANTS.items():
        for gen in (True, False):
            for thinking in (None, True, False):
                expected = jinja_render(variant, normalized, tools, gen, thinking)
                got = render_qwen35(
                    messages,
                    tools,
                    add_generation_prompt=gen,
                    enable_thinking=thinking,
                    default_thinking=default,
                )
                assert got == expected, f"{name} {variant} gen={gen} thinking={thinking}"


def test_parts_join_to_text() -> None:
    for _, messages, tools in CONVERSATIONS:
        parts = render_qwen35_parts(messages, tools)
        assert parts.text == render_qwen35(messages, tools)
        assert len(parts.messages) == len(messages)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "system", "content": "only system"}],
        [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}],
        [{"role": "wizard", "content": "a"}, {"role": "user", "content": "b"}],
        [{"role": "user", "content": {"bad": 1}}],
        [{"role": "user", "content": [{"type": "audio"}]}],
    ],
)
def test_errors_where_official_errors(
    jinja_render: Callable[..., str], messages: list[dict[str, Any]]
) -> None:
    with pytest.raises(jinja2.exceptions.TemplateError):
        jinja_render("think", normalize_messages(messages), None)
    with pytest.raises(TemplateError):
        render_qwen35(messages)


def test_bad_json_arguments_raise() -> None:
    msgs = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}],
        },
    ]
    with pytest.raises(TemplateError):
        render_qwen35(msgs, TOOLS)


def test_transformers_agrees_when_installed(official_templates: dict[str, str]) -> None:
    """Cross-check against transformers' own renderer (optional dependency)."""
    cct = pytest.importorskip("transformers.utils.chat_template_utils")
    for _, messages, tools in CONVERSATIONS[:20]:
        normalized = normalize_messages(messages)
        expected = cct.render_jinja_template(
            [normalized], tools=tools, chat_template=official_templates["think"], add_generation_prompt=True
        )[0][0]
        assert render_qwen35(messages, tools) == expected
