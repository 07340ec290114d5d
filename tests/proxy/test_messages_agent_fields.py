"""Fields Claude Code 2.1 sends beyond the basic Messages API: accepted and recorded, or refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dressage.errors import RequestError
from dressage.proxy.dialects.messages import parse_messages_request


def body(**extra: Any) -> bytes:
    base = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({**base, **extra}).encode()


def test_claude_code_effort_and_clear_thinking_edit_are_recorded_as_ignored() -> None:
    conv = parse_messages_request(
        body(
            output_config={"effort": "high"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            thinking={"type": "adaptive", "display": "omitted"},
        )
    )
    assert {"output_config.effort", "context_management", "thinking.display"} <= set(conv.ignored)
    assert conv.enable_thinking is True
    with pytest.raises(RequestError, match="thinking"):
        parse_messages_request(body(thinking={"type": "adaptive", "frobnicate": 1}))


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"output_config": {"format": {"type": "json_schema"}}}, "format"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"output_config": "high"}, "output_config"),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits[0].type",
        ),
        ({"context_management": {"edits": "all"}}, "context_management"),
    ],
)
def test_other_output_config_keys_and_context_edits_are_refused(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_messages_request(body(**extra))
    assert err.value.param == param
