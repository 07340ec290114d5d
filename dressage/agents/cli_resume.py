"""Resume modes of blackbox agent CLIs that persist their own sessions (issue 38, per-turn checkpoints).

A fork or an in-flight resume that starts from a sandbox checkpoint taken at turn K restores the
workspace (which holds each CLI's state directory, ``.dressage/<cli>``, see
:mod:`dressage.agents.native_clis`) and may start the CLI in its own resume mode instead of running
it from the start and replaying turns ``0 .. K-1``. That is sound only when the CLI's first request
is the parent's request K token for token; the proxy checks it (:func:`check_first_request`) and
falls back to replay, recording why, when it is not.

For each CLI this module says

- where it persists its session (:attr:`CliResumeMode.session_paths`, workspace-relative: the
  checkpoint must hold them; the rest of its state directory is optional),
- how its session id is found in the restored files (:meth:`CliResumeMode.session_id`) and how it is
  started in resume mode (:meth:`CliResumeMode.resume_args`),
- what a CLI without a resume mode reports (:data:`NO_RESUME_MODE`, a :class:`NoResume` reason).

Measured with Claude Code 2.1.328 and Codex 0.169.0 (docs/rollout.md, "Resume modes"): both resume
modes restore the conversation exactly (Claude Code's system prompt is its recorded
``prompt_snapshot``, its tools and ``metadata.session_id`` are the parent's; Codex's instructions,
tools and ``prompt_cache_key`` are the parent's), but both *append a user turn*: Codex adds the
resume prompt as a user message (``codex exec resume`` refuses to run without one; an empty one is
sent as an empty message), Claude Code adds the prompt too and, after a trailing tool result, an
assistant message ``No response requested.`` before it (a tool result fed back as
``--input-format stream-json`` is not taken as the missing result: Claude Code marks the call
interrupted). So the first request equals the parent's request K only when request K *is* the first
request of a user turn whose text is the resume input; a checkpoint inside a tool loop
(:meth:`CliResumeMode.mid_tool_loop`) can never match and falls back to replay.
"""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dressage.errors import SandboxError
from dressage.paddock import Sandbox
from dressage.tito.render_cache import common_prefix_len

RESUME_INPUT_ENV = "DRESSAGE_RESUME_INPUT"
"""The environment variable that carries the resumed CLI's next user input into its command line."""


@dataclass(frozen=True)
class ResumeCommand:
    """How to start a CLI in its resume mode in a sandbox whose session files were restored."""

    kind: str
    session_id: str
    session_file: str
    """Workspace-relative path of the session file the id came from."""
    argv: str
    """Shell command line (run with the agent's environment plus :data:`RESUME_INPUT_ENV`)."""
    next_input: str
    mid_tool_loop: bool
    """The session ends in a tool result: the resumed request appends a user turn to the parent's
    request K, so it cannot match it (the caller may skip the attempt and replay at once)."""
    appends: str = ""
    """What this CLI's resume mode appends after a trailing tool result (for the recorded reason)."""

    @property
    def mismatch(self) -> str | None:
        """Why the first request cannot be the parent's request K (None when it may be): the reason
        to record when the caller replays without starting the CLI."""
        if not self.mid_tool_loop:
            return None
        return (
            f"{self.kind} session {self.session_id} ends inside a tool loop and its resume mode appends "
            f"{self.appends}: its first request cannot be the parent's request K"
        )


@dataclass(frozen=True)
class NoResume:
    """A CLI that cannot be resumed from its own files: the caller replays; ``reason`` is recorded."""

    kind: str
    reason: str


@dataclass(frozen=True)
class FirstRequestCheck:
    """Whether a resumed CLI's first request renders to the parent's request K (the proxy's test)."""

    exact: bool
    common_prefix: int
    """Leading prompt tokens the two requests share."""
    reason: str | None = None
    """Why not, naming the difference (recorded with the fallback to replay)."""


class CliResumeMode(ABC):
    """One CLI's resume mode: where its session lives, how to find its id and start it resumed."""

    kind: str
    state_dir: str
    """The CLI's whole state directory in the workspace (config, caches, ids, its session files)."""
    session_paths: tuple[str, ...]
    """Workspace-relative paths that must be in the checkpoint for the resume mode to work."""
    appends: str
    """What the resume mode appends after a trailing tool result (measured)."""
    session_glob: str
    """``find -path`` pattern of a session file under :attr:`state_dir`."""
    session_depth: int
    """How deep below :attr:`state_dir` a session file lies (deeper matches are sub-sessions)."""

    @abstractmethod
    def session_id(self, session_file: str, text: str) -> str:
        """The id the resume flag takes, from a session file's path and content (ValueError if none)."""

    @abstractmethod
    def mid_tool_loop(self, text: str) -> bool:
        """Whether the session's last conversational entry is a tool result (an unfinished loop)."""

    @abstractmethod
    def tool_results(self, text: str) -> int:
        """How many tool results the session file holds. A CLI writes its file on its own schedule:
        Claude Code had not always written the last tool result when the request carrying it reached
        the model, so a checkpoint taken then holds a dangling tool call (which its resume marks
        interrupted); a checkpoint is complete when this equals the results request K carries."""

    @abstractmethod
    def resume_args(self, session_id: str) -> list[str]:
        """Arguments that turn the CLI's normal command into its resume command for ``session_id``."""

    async def find_session(self, sandbox: Sandbox) -> str | NoResume:
        """The one session file under :attr:`state_dir` in ``sandbox`` (a NoResume if none or several)."""
        r = await sandbox.exec(
            [
                "find",
                self.state_dir,
                "-mindepth",
                str(self.session_depth),
                "-maxdepth",
                str(self.session_depth),
                "-path",
                self.session_glob,
                "-type",
                "f",
            ],
            timeout=60,
        )
        found = sorted(line for line in r.stdout.splitlines() if line.strip())
        if not found:
            return NoResume(
                self.kind,
                f"no {self.kind} session file ({self.state_dir}/{self.session_glob.split('/', 1)[-1]}) "
                "in the restored workspace: the checkpoint must hold "
                f"{', '.join(self.session_paths)}",
            )
        if len(found) > 1:
            return NoResume(self.kind, f"{len(found)} {self.kind} sessions in the workspace: {found[:4]}")
        return found[0]

    async def command(self, sandbox: Sandbox, base_argv: str, next_input: str) -> ResumeCommand | NoResume:
        """The resume command: ``base_argv`` (the agent's normal command line, ending with its
        prompt argument) with the resume arguments and ``$DRESSAGE_RESUME_INPUT`` as the prompt."""
        found = await self.find_session(sandbox)
        if isinstance(found, NoResume):
            return found
        try:
            text = (await sandbox.read_file(found)).decode("utf-8", errors="replace")
            session_id = self.session_id(found, text)
        except (SandboxError, ValueError) as e:
            return NoResume(self.kind, f"{self.kind} session file {found} unreadable: {e}")
        try:
            argv = self.splice(base_argv, session_id)
        except ValueError as e:
            return NoResume(self.kind, str(e))
        return ResumeCommand(
            self.kind, session_id, found, argv, next_input, self.mid_tool_loop(text), self.appends
        )

    @abstractmethod
    def splice(self, base_argv: str, session_id: str) -> str:
        """``base_argv`` turned into the resume command line."""


def jsonl(text: str) -> list[dict[str, object]]:
    """The JSON objects of a JSON-lines file (a torn last line, from a copy taken mid-write, skipped)."""
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


class ClaudeCodeResume(CliResumeMode):
    """``claude ... --resume <session-id> -p "$DRESSAGE_RESUME_INPUT"``.

    Claude Code writes one transcript per session to
    ``$CLAUDE_CONFIG_DIR/projects/<cwd with / as ->/<session-id>.jsonl`` (``-workspace`` for the
    sandbox's ``/workspace``), an entry per message (``type`` ``user`` / ``assistant``, with
    ``sessionId``) and its ``prompt_snapshot`` (the system prompt, reused verbatim on resume, so the
    date in it stays the parent's). The transcript alone resumes the session; ``.claude.json``
    (its ``userID``) only changes ``metadata.user_id.device_id``, which is not rendered.
    """

    kind = "claude_code"
    state_dir = ".dressage/claude"
    session_paths = (".dressage/claude/projects",)
    appends = "an assistant message 'No response requested.' and the input as a user message"
    session_glob = "*/projects/*/*.jsonl"
    session_depth = 3

    def session_id(self, session_file: str, text: str) -> str:
        """The file's stem, which the entries' ``sessionId`` confirms."""
        stem = session_file.rsplit("/", 1)[-1].removesuffix(".jsonl")
        ids = {e.get("sessionId") for e in jsonl(text) if e.get("sessionId")}
        if ids and ids != {stem}:
            raise ValueError(f"its entries name sessions {sorted(map(str, ids))}, not {stem}")
        return stem

    def mid_tool_loop(self, text: str) -> bool:
        """The last ``user``/``assistant`` entry is a user message of tool results."""
        messages = [e for e in jsonl(text) if e.get("type") in ("user", "assistant")]
        if not messages:
            return False
        message = messages[-1].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )

    def tool_results(self, text: str) -> int:
        """``tool_result`` blocks in the transcript's user messages."""
        count = 0
        for entry in jsonl(text):
            message = entry.get("message") if entry.get("type") == "user" else None
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                count += sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
        return count

    def resume_args(self, session_id: str) -> list[str]:
        """``--resume <id>`` (the same session id: ``metadata.session_id`` stays the parent's)."""
        return ["--resume", session_id]

    def splice(self, base_argv: str, session_id: str) -> str:
        """``... -p "$DRESSAGE_PROMPT"`` becomes ``... --resume <id> -p "$DRESSAGE_RESUME_INPUT"``."""
        return replace_prompt(base_argv, ' -p "$DRESSAGE_PROMPT"', self.resume_args(session_id), "-p ")


class CodexResume(CliResumeMode):
    """``codex exec ... resume <session-id> "$DRESSAGE_RESUME_INPUT"``.

    Codex writes one rollout per session to
    ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<session-id>.jsonl``; its first line is
    ``session_meta`` with the id, then ``response_item`` lines (messages, function calls and their
    outputs) and events. The rollout (with ``config.toml``) resumes the session; the SQLite state and
    ``installation_id`` only change ids in ``client_metadata``, which is not rendered.
    """

    kind = "codex"
    state_dir = ".dressage/codex"
    session_paths = (".dressage/codex/sessions", ".dressage/codex/config.toml")
    appends = "the input as a user message"
    session_glob = "*/sessions/*/rollout-*.jsonl"
    session_depth = 5

    def session_id(self, session_file: str, text: str) -> str:
        """``payload.id`` of the ``session_meta`` line."""
        for entry in jsonl(text):
            payload = entry.get("payload")
            if entry.get("type") == "session_meta" and isinstance(payload, dict) and payload.get("id"):
                return str(payload["id"])
        raise ValueError("no session_meta line with an id")

    def mid_tool_loop(self, text: str) -> bool:
        """The last ``response_item`` is a ``function_call_output``."""
        items = [e.get("payload") for e in jsonl(text) if e.get("type") == "response_item"]
        last = items[-1] if items else None
        return isinstance(last, dict) and last.get("type") == "function_call_output"

    def tool_results(self, text: str) -> int:
        """``function_call_output`` response items in the rollout."""
        return sum(
            1
            for e in jsonl(text)
            if e.get("type") == "response_item"
            and isinstance(p := e.get("payload"), dict)
            and p.get("type") == "function_call_output"
        )

    def resume_args(self, session_id: str) -> list[str]:
        """``resume <id>`` after ``codex exec``'s options."""
        return ["resume", session_id]

    def splice(self, base_argv: str, session_id: str) -> str:
        """``... "$DRESSAGE_PROMPT"`` becomes ``... resume <id> "$DRESSAGE_RESUME_INPUT"``."""
        return replace_prompt(base_argv, ' "$DRESSAGE_PROMPT"', self.resume_args(session_id), "")


def replace_prompt(base_argv: str, tail: str, resume_args: Sequence[str], flag: str) -> str:
    """``base_argv`` with its prompt ``tail`` replaced by ``resume_args`` and the resume input."""
    if not base_argv.endswith(tail):
        raise ValueError(f"cannot resume a command that does not end in {tail.strip()!r}: {base_argv!r}")
    return f'{base_argv[: -len(tail)]} {shlex.join(resume_args)} {flag}"${RESUME_INPUT_ENV}"'


RESUME_MODES: dict[str, CliResumeMode] = {m.kind: m for m in (ClaudeCodeResume(), CodexResume())}
"""The CLIs started in their own resume mode, by agent kind."""

NO_RESUME_MODE: dict[str, str] = {
    "mini_swe_agent": "mini-swe-agent 2.4.6 has no resume mode (its trajectory file is output only)",
    "command": "a generic command agent has no known resume mode",
    "openclaw": "openclaw's resume mode is not wired (not measured)",
    "opencode": "opencode's session resume (opencode run --session) is not wired (not measured)",
    "gemini_cli": (
        "Gemini CLI 0.61.0's --resume <session-id> resends every recorded tool result twice (two equal "
        "functionResponse parts per user turn) and appends a model turn '[The previous response was "
        "interrupted before it completed.]' and the input, so its first request never equals the parent's"
    ),
    "qwen_code": (
        "Qwen Code 0.24.4's --resume <session-id> rebuilds its first user message (the folder listing of "
        "the restored workspace, a date reminder) and appends the input, so its first request differs "
        "from the parent's (measured once; not wired)"
    ),
}
"""Why a CLI without a wired resume mode replays (recorded with the fallback)."""


def resume_mode(kind: str) -> CliResumeMode | NoResume:
    """The resume mode of agent ``kind``, or why it has none (then the caller replays)."""
    if kind in RESUME_MODES:
        return RESUME_MODES[kind]
    return NoResume(kind, NO_RESUME_MODE.get(kind, f"agent kind {kind!r} has no resume mode"))


def check_first_request(
    parent_ids: Sequence[int], resumed_ids: Sequence[int], decode: Callable[[list[int]], str] | None = None
) -> FirstRequestCheck:
    """Whether the resumed CLI's first request renders to the parent's request K token for token;
    if not, a reason naming where they part and what follows there (decoded with ``decode``)."""
    parent, resumed = list(parent_ids), list(resumed_ids)
    common = common_prefix_len(parent, resumed)
    if parent == resumed:
        return FirstRequestCheck(True, common)

    def shown(ids: list[int]) -> str:
        return repr(decode(ids[common : common + 40])) if decode else str(ids[common : common + 8])

    if common == len(parent):
        how = f"extends the parent's request K ({len(parent)} tokens) by {len(resumed) - common} tokens: {shown(resumed)}"
    else:
        how = (
            f"differs from the parent's request K at token {common} of {len(parent)}: "
            f"parent {shown(parent)}, resumed {shown(resumed)}"
        )
    return FirstRequestCheck(False, common, f"the resumed CLI's first request {how}")
