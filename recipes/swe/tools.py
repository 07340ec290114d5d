"""The edit/run agent's tools over a sandbox: run a shell command, view a file, edit a file.

Function names and JSON schemas are OpenAI function-calling entries (the chat dialect). Like
:class:`dressage.paddock.SandboxTools`, :meth:`EditRunTools.call` never raises for the model's
mistakes: it returns an ``error: ...`` text the model reads and can act on.
"""

from __future__ import annotations

import json
from typing import Any

from dressage.errors import SandboxError
from dressage.paddock import Sandbox
from dressage.paddock.tools import format_exec_result

VIEW_MAX_LINES = 400

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a bash command in the repository root and return its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command line."}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view",
            "description": f"Show a file with line numbers (at most {VIEW_MAX_LINES} lines from `start`).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the repository root."},
                    "start": {"type": "integer", "description": "First line to show (1-based, optional)."},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace the one occurrence of `old` in a file by `new`; an empty `old` creates "
            "the file with `new` as its content.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the repository root."},
                    "old": {
                        "type": "string",
                        "description": "The exact text to replace (unique in the file).",
                    },
                    "new": {"type": "string", "description": "The replacement text."},
                },
                "required": ["path", "old", "new"],
                "additionalProperties": False,
            },
        },
    },
]


class EditRunTools:
    """``run``, ``view`` and ``edit`` over one sandbox (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, timeout_s: float = 60.0) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` entries (a fresh copy)."""
        return json.loads(json.dumps(SCHEMAS))

    async def call(self, name: str, arguments_json: str) -> str:
        """Run tool ``name`` with the model's JSON arguments; the result or an error text."""
        try:
            args = json.loads(arguments_json or "{}")
        except json.JSONDecodeError as e:
            return f"error: arguments for {name} are not valid JSON ({e.msg} at position {e.pos})"
        if not isinstance(args, dict):
            return f"error: arguments for {name} must be a JSON object"
        try:
            if name == "run":
                return await self._run(_str(args, "command"))
            if name == "view":
                start = args.get("start", 1)
                if not isinstance(start, int) or start < 1:
                    return "error: 'start' must be a positive line number"
                return await self._view(_str(args, "path"), start)
            if name == "edit":
                return await self._edit(_str(args, "path"), _str(args, "old"), _str(args, "new"))
        except _ArgError as e:
            return f"error: {e}"
        except SandboxError as e:
            return f"error: {e}"
        return f"error: unknown tool {name!r}; available tools: run, view, edit"

    async def _run(self, command: str) -> str:
        return format_exec_result(await self.sandbox.exec(["bash", "-c", command], timeout=self.timeout_s))

    async def _view(self, path: str, start: int) -> str:
        lines = (await self.sandbox.read_file(path)).decode("utf-8", errors="replace").splitlines()
        shown = lines[start - 1 : start - 1 + VIEW_MAX_LINES]
        body = "\n".join(f"{start + i:6d}\t{line}" for i, line in enumerate(shown))
        more = len(lines) - (start - 1 + len(shown))
        return body + (f"\n[... {more} more lines; view with start={start + len(shown)}]" if more > 0 else "")

    async def _edit(self, path: str, old: str, new: str) -> str:
        if not old:
            await self.sandbox.write_file(path, new)
            return f"created {path} ({len(new.splitlines())} lines)"
        text = (await self.sandbox.read_file(path)).decode("utf-8", errors="replace")
        count = text.count(old)
        if count != 1:
            return f"error: `old` occurs {count} times in {path}; it must occur exactly once"
        await self.sandbox.write_file(path, text.replace(old, new, 1))
        return f"edited {path}"


class _ArgError(Exception):
    pass


def _str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise _ArgError(f"missing or non-string argument {key!r}")
    return value
