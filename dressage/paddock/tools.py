"""Sandbox tools for whitebox agents, with OpenAI function-calling schemas.

Tool names: OpenAI function names must match ``^[a-zA-Z0-9_-]+$``, so the dotted names used in
docs and configs map to underscores on the wire:

=============  ==============
concept        function name
=============  ==============
shell.exec     ``shell_exec``
file.read      ``file_read``
file.write     ``file_write``
=============  ==============

:meth:`SandboxTools.call` accepts either spelling. It never raises for the model's mistakes (bad
JSON, missing fields, unknown tool, a path outside the workspace): it returns an ``error: ...``
string, because the model should see what went wrong and try again.
"""

from __future__ import annotations

import json
from typing import Any

from dressage.errors import SandboxError
from dressage.paddock.base import ExecResult, Sandbox

TOOL_ALIASES = {"shell.exec": "shell_exec", "file.read": "file_read", "file.write": "file_write"}

MAX_READ_CHARS = 64 * 1024

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell_exec",
            "description": "Run a shell command (/bin/sh -c) in the workspace and return its exit code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string", "description": "The shell command line to run."},
                    "timeout": {
                        "type": "number",
                        "description": "Seconds before the command is killed (optional).",
                    },
                },
                "required": ["cmd"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "file_read",
            "description": "Read a text file from the workspace (path relative to the workspace).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the workspace."}
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "file_write",
            "description": "Create or overwrite a text file in the workspace (parent directories are created).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the workspace."},
                    "content": {"type": "string", "description": "The full new content of the file."},
                },
                "required": ["path", "content"],
                "additionalProperties": False,
            },
        },
    },
]


def format_exec_result(r: ExecResult) -> str:
    """Render an :class:`ExecResult` as the text a model reads."""
    parts = [f"exit_code: {r.exit_code}" + (" (timed out, killed)" if r.timed_out else "")]
    for name, text, cut in (
        ("stdout", r.stdout, r.stdout_truncated),
        ("stderr", r.stderr, r.stderr_truncated),
    ):
        if text or cut:
            parts.append(f"{name}:\n{text}" + ("\n[... output truncated]" if cut else ""))
    return "\n".join(parts)


class SandboxTools:
    """The three basic tools over one sandbox: ``.schemas`` for the request, ``.call`` for the reply."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI ``tools`` entries (a fresh copy each time; callers may edit it)."""
        return json.loads(json.dumps(SCHEMAS))

    async def call(self, name: str, arguments_json: str) -> str:
        """Run tool ``name`` with the model's JSON arguments; return the text result or an error text."""
        fn = TOOL_ALIASES.get(name, name)
        try:
            args = json.loads(arguments_json) if arguments_json and arguments_json.strip() else {}
        except json.JSONDecodeError as e:
            return f"error: arguments for {name} are not valid JSON ({e.msg} at position {e.pos})"
        if not isinstance(args, dict):
            return f"error: arguments for {name} must be a JSON object"
        try:
            if fn == "shell_exec":
                cmd = _field(args, "cmd", str)
                timeout = args.get("timeout")
                if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
                    return "error: 'timeout' must be a positive number of seconds"
                return format_exec_result(await self.sandbox.exec(cmd, timeout=timeout))
            if fn == "file_read":
                data = await self.sandbox.read_file(_field(args, "path", str))
                text = data.decode("utf-8", errors="replace")
                if len(text) > MAX_READ_CHARS:
                    return text[:MAX_READ_CHARS] + f"\n[... truncated, file has {len(text)} characters]"
                return text
            if fn == "file_write":
                path, content = _field(args, "path", str), _field(args, "content", str)
                await self.sandbox.write_file(path, content)
                return f"wrote {len(content.encode())} bytes to {path}"
        except _ArgError as e:
            return f"error: {e}"
        except SandboxError as e:
            return f"error: {e}"
        known = ", ".join(s["function"]["name"] for s in SCHEMAS)
        return f"error: unknown tool {name!r}; available tools: {known}"


class _ArgError(Exception):
    pass


def _field(args: dict[str, object], key: str, typ: type) -> Any:
    if key not in args:
        raise _ArgError(f"missing required argument {key!r}")
    if not isinstance(args[key], typ):
        raise _ArgError(f"argument {key!r} must be a {typ.__name__}")
    return args[key]
