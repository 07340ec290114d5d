"""Helpers for driving the proxy like an agent would."""

from __future__ import annotations

from typing import Any

import httpx
from openai import OpenAI

NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List a directory",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def clean_seed(probe: OpenAI, messages: list[dict[str, Any]], **kw: Any) -> int:
    """A seed whose reply the chat template re-renders exactly (no surrounding whitespace).

    The tiny random model often starts with a space, which the template strips from assistant
    content, breaking the prefix (correctly: a new segment). Tool-loop tests need replies an agent
    would send back verbatim, so they find a seed in a separate probe session first (same prompt
    ids, same seed -> same output: the dev engine is deterministic).
    """
    for seed in range(200):
        r = probe.chat.completions.create(model="m", messages=messages, seed=seed, **kw)
        content = r.choices[0].message.content or ""
        if content and content == content.strip():
            return seed
    raise AssertionError("no clean seed found")


def step(client: OpenAI, probe: OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    """One tool-loop turn: the reply, appended to ``messages`` with a tool result."""
    kw = {"max_tokens": 4, "tools": TOOLS, "extra_body": NOTHINK, **kw}
    seed = clean_seed(probe, messages, **kw)
    r = client.chat.completions.create(model="m", messages=messages, seed=seed, **kw)
    messages.append({"role": "assistant", "content": r.choices[0].message.content})
    messages.append(
        {"role": "tool", "tool_call_id": f"call{len(messages)}", "content": f"file{len(messages)}.txt"}
    )
    return r


def abandon_mid_stream(base_url: str, token: str, messages: list[dict[str, Any]], seed: int = 4) -> None:
    """Stream a reply (idempotency key ``turn-1``, sampling seed ``seed``) and close the connection
    once three tokens arrived: the client goes away mid-stream."""
    body = {"model": "m", "messages": messages, "max_tokens": 200, "seed": seed, "stream": True,
            "logprobs": True, **NOTHINK}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "turn-1"}
    received = 0
    with (
        httpx.Client(base_url=base_url, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("data:") and '"logprobs":{' in line:
                received += 1
            if received >= 3:
                break
