"""Request parsing per dialect: the typed schemas of today against the hand-written parsers they replaced.

Each dialect (chat completions, Anthropic Messages, OpenAI Responses) parses two bodies as a
coding agent sends them: a typical one (system prompt, 5 tools, one tool call and its result) and a
200-message tool loop (100 calls, 100 ~1.2 kB results; ~150 kB). "hand" is the dialect module at
``--baseline`` (a commit before the schemas; it and its ``conversation.py`` are read with
``git show`` and loaded under private names), "schema" the module in this checkout. Both run
the whole parse the proxy runs per turn: bytes to :class:`Conversation`.

Printed per (dialect, body), all in CPU time (``time.process_time``: the machine may be shared): warm µs per parse (median of ``--reps`` interleaved rounds, each the
mean of a batch) and the ratio schema / hand; cold ms (the first parse in a fresh interpreter,
after the imports, median of ``--cold`` interpreters) and its ratio; and, where the dialect has a
schema, the schema's validation alone from the decoded dict (``model_validate``) against from the
raw bytes (``model_validate_json``), to show which path the per-turn parse should take.

Run: ``python bench/parse_dialects.py [--baseline f4f6fef] [--reps 15] [--cold 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

DIALECTS = ("chat", "messages", "responses")
BASELINE = "f4f6fef"
"""The last commit whose dialects parsed by hand (issue 37, point 4)."""

_SCHEMA = {"chat": ("chat_models", "ChatRequest"), "messages": ("messages_models", "MessagesRequest"),
           "responses": ("responses_models", "ResponsesRequest")}  # fmt: skip


def _tools() -> list[dict[str, object]]:
    """Five function tools as an agent declares them (name, description, an object schema)."""
    return [
        {"name": f"tool_{i}", "description": f"Tool number {i}: does one thing well.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "A path"},
                                                          "limit": {"type": "integer"}}, "required": ["path"]}}
        for i in range(5)
    ]  # fmt: skip


def _result(i: int) -> str:
    return f"line {i}: " + "x = compute(y) + 1  # a line of a file the tool read\n" * 24


def chat_body(turns: int) -> dict[str, object]:
    """A chat-completions tool loop of ``turns`` calls and results after the system and user messages."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the bug in main.py."},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "tool_0", "arguments": json.dumps({"path": f"/src/f{i}.py"})}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": _result(i)},
        ]
    tools = [{"type": "function", "function": t} for t in _tools()]
    return {"model": "m", "messages": messages, "tools": tools, "max_tokens": 64, "stream": False,
            "temperature": 0.7, "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip


def messages_body(turns: int) -> dict[str, object]:
    """An Anthropic Messages tool loop (tool_use blocks back, tool_result blocks), as Claude Code sends it."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "Find the bug in main.py."}]
    for i in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "tool_0", "input": {"path": f"/src/f{i}.py"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": _result(i)}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    tools = [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in _tools()
    ]
    return {"model": "m", "system": "You are a coding agent.", "messages": messages, "tools": tools,
            "max_tokens": 64, "stream": False, "temperature": 0.7, "thinking": {"type": "disabled"}}  # fmt: skip


def responses_body(turns: int) -> dict[str, object]:
    """An OpenAI Responses input sent back whole (as Codex does): calls and their outputs."""
    items: list[dict[str, object]] = [
        {"type": "message", "role": "user", "content": "Find the bug in main.py."}
    ]
    for i in range(turns):
        items += [
            {"type": "function_call", "call_id": f"call_{i}", "name": "tool_0",
             "arguments": json.dumps({"path": f"/src/f{i}.py"})},
            {"type": "function_call_output", "call_id": f"call_{i}", "output": _result(i)},
        ]  # fmt: skip
    tools = [{"type": "function", **t} for t in _tools()]
    return {"model": "m", "instructions": "You are a coding agent.", "input": items, "tools": tools,
            "max_output_tokens": 64, "stream": False, "store": False, "temperature": 0.7,
            "reasoning": {"effort": "none"}}  # fmt: skip


BODIES = {"chat": chat_body, "messages": messages_body, "responses": responses_body}
SIZES = {"typical": 1, "200 msgs": 99}  # 99 calls + 99 results + system/user = 200 messages


def _git_show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def hand_module(dialect: str, rev: str) -> types.ModuleType:
    """The dialect module at ``rev``, importing the ``conversation.py`` of ``rev`` (not this checkout's)."""
    if "_hand_conversation" not in sys.modules:
        _load("_hand_conversation", _git_show(rev, "dressage/proxy/conversation.py"))
    source = _git_show(rev, f"dressage/proxy/dialects/{dialect}.py")
    return _load(f"_hand_{dialect}", source.replace("dressage.proxy.conversation", "_hand_conversation"))


def schema_module(dialect: str) -> types.ModuleType:
    __import__(f"dressage.proxy.dialects.{dialect}")
    return sys.modules[f"dressage.proxy.dialects.{dialect}"]


def parser(module: types.ModuleType, dialect: str) -> Callable[[bytes], object]:
    """The module's whole per-turn parse, bytes to Conversation."""
    if dialect == "chat":
        return module.parse_chat_request  # type: ignore[no-any-return]
    if dialect == "messages":
        return module.parse_messages_request  # type: ignore[no-any-return]
    dialect_obj = module.ResponsesDialect.__new__(module.ResponsesDialect)
    return lambda raw: dialect_obj.parse(raw, None, None)


def _batch(fn: Callable[[bytes], object], raw: bytes, n: int) -> float:
    start = time.process_time()  # CPU time: the machine may be shared
    for _ in range(n):
        fn(raw)
    return (time.process_time() - start) / n * 1e6


def warm(dialect: str, raw: bytes, rev: str, reps: int) -> tuple[float, float]:
    """Median µs per parse, hand and schema, in interleaved rounds."""
    hand, schema = parser(hand_module(dialect, rev), dialect), parser(schema_module(dialect), dialect)
    n = max(3, int(2e5 // len(raw)))
    hands, schemas = [], []
    for _ in range(reps):
        hands.append(_batch(hand, raw, n))
        schemas.append(_batch(schema, raw, n))
    return statistics.median(hands), statistics.median(schemas)


def cold(dialect: str, size: str, which: str, rev: str, runs: int) -> float:
    """Median ms of the first parse in a fresh interpreter (imports done first)."""
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--first", dialect, size, which, "--baseline", rev],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        times.append(float(out.stdout.strip()))
    return statistics.median(times)


def first_parse(dialect: str, size: str, which: str, rev: str) -> None:
    raw = orjson.dumps(BODIES[dialect](SIZES[size]))
    fn = parser(hand_module(dialect, rev) if which == "hand" else schema_module(dialect), dialect)
    start = time.process_time()
    fn(raw)
    print(f"{(time.process_time() - start) * 1e3:.3f}")


def validation_paths(dialect: str, raw: bytes, reps: int) -> tuple[float, float] | None:
    """µs of the schema's validation alone: from the orjson-decoded dict, and from the raw bytes."""
    module_name, cls_name = _SCHEMA[dialect]
    try:
        module = __import__(f"dressage.proxy.dialects.{module_name}", fromlist=[cls_name])
    except ImportError:
        return None
    model = getattr(module, cls_name)
    n = max(3, int(2e5 // len(raw)))
    from_dict = [_batch(lambda r: model.model_validate(orjson.loads(r)), raw, n) for _ in range(reps)]
    from_json = [_batch(model.model_validate_json, raw, n) for _ in range(reps)]
    return statistics.median(from_dict), statistics.median(from_json)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the hand-written parsers")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cold", type=int, default=5, help="fresh interpreters per cold figure")
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--first", nargs=3, metavar=("DIALECT", "SIZE", "WHICH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.first:
        first_parse(*args.first, rev=args.baseline)
        return
    print(f"baseline {args.baseline}; python {sys.version.split()[0]}")
    print(f"{'dialect':10} {'body':9} {'kB':>6} {'hand us':>9} {'schema us':>9} {'ratio':>6} "
          f"{'hand cold ms':>12} {'schema cold ms':>14} {'ratio':>6} {'dict us':>8} {'json us':>8}")  # fmt: skip
    for dialect in args.dialects.split(","):
        for size, turns in SIZES.items():
            raw = orjson.dumps(BODIES[dialect](turns))
            hand, schema = warm(dialect, raw, args.baseline, args.reps)
            hand_cold = cold(dialect, size, "hand", args.baseline, args.cold)
            schema_cold = cold(dialect, size, "schema", args.baseline, args.cold)
            paths = validation_paths(dialect, raw, args.reps)
            dict_us, json_us = (f"{paths[0]:8.0f}", f"{paths[1]:8.0f}") if paths else ("       -", "       -")
            print(f"{dialect:10} {size:9} {len(raw) / 1e3:6.1f} {hand:9.0f} {schema:9.0f} {schema / hand:6.2f} "
                  f"{hand_cold:12.2f} {schema_cold:14.2f} {schema_cold / hand_cold:6.2f} {dict_us} {json_us}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
