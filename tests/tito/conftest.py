"""Shared, session-scoped fixtures for the TITO tests: one tokenizer, the official templates."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dressage.errors import DressageError
from dressage.tito.official_templates import official_qwen35_template
from dressage.tito.tokenizer import Tokenizer, load_qwen35_tokenizer


@pytest.fixture(scope="session")
def qwen_tok() -> Tokenizer:
    """The Qwen3.5 tokenizer (built once into the user cache, then loaded)."""
    return load_qwen35_tokenizer()


@pytest.fixture(scope="session")
def official_templates() -> dict[str, str]:
    """Official template texts by variant; skips when they cannot be found or downloaded."""
    try:
        return {v: official_qwen35_template(v) for v in ("think", "nothink")}
    except DressageError as e:
        pytest.skip(f"official Qwen3.5 templates unavailable: {e}")


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@pytest.fixture(scope="session")
def jinja_render(official_templates: dict[str, str]) -> Callable[..., str]:
    """Render with the official jinja text in an environment set up like transformers' one."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["namespace"] = jinja2.utils.Namespace
    compiled = {v: env.from_string(t) for v, t in official_templates.items()}

    def render(
        variant: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        return compiled[variant].render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    return render
