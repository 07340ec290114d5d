"""Agent CLIs run unmodified, each pointed at the proxy's route for the API dialect it speaks.

- **Claude Code** (``claude``) speaks only the Anthropic Messages API: it appends
  ``/v1/messages?beta=true`` to ``ANTHROPIC_BASE_URL``, so the base is the session's root
  ``http://127.0.0.1:<port>/s/<token>`` and the token goes in ``x-api-key`` (``ANTHROPIC_API_KEY``).
- **Codex** (``codex``) speaks only the OpenAI Responses API (``wire_api = "responses"``; ``"chat"`` is
  refused by 0.169): a ``model_provider`` in ``$CODEX_HOME/config.toml`` with the proxy's ``/v1``
  URL as ``base_url`` and ``OPENAI_API_KEY`` (the token, sent as a Bearer header) as ``env_key``.
  The URL has no token in its path: the config file lives in the workspace, which is archived.

- **Qwen Code** (``qwen``, a Gemini CLI fork) speaks OpenAI chat completions (``--auth-type openai``):
  ``OPENAI_BASE_URL`` is the session's ``/v1`` URL, ``OPENAI_API_KEY`` the token; its settings
  (telemetry, usage statistics, update checks off) are in ``$QWEN_HOME/settings.json``.

- **Gemini CLI** (``gemini``) speaks the Gemini API (``models/{model}:streamGenerateContent``):
  ``GOOGLE_GEMINI_BASE_URL`` is the session's root ``http://127.0.0.1:<port>/s/<token>`` (the SDK
  appends ``/v1beta/...``) and ``GEMINI_API_KEY`` the token (sent as ``x-goog-api-key``); settings
  (API-key auth, telemetry, usage statistics, update checks off) in ``$GEMINI_CLI_HOME/.gemini``.
- **mini-swe-agent** (``mini``, Python, in its own venv) calls chat completions through litellm's
  ``openai/<model>`` route, which reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; its one tool is
  ``bash``, and a command whose output starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` ends the
  run with the rest of that output as the submission.

All run with the sandbox as the only boundary (network off, the proxy reached through the
Unix-socket forwarder) and keep their state under ``.dressage/`` in the workspace. The switches in
each ``env`` / config keep them offline: no update checks, telemetry, error reports, web search.
"""

from __future__ import annotations

import json
import shlex

from dressage.agents.base import AgentContext
from dressage.agents.blackbox import BlackboxAgent, bearer_base, output_tail
from dressage.agents.config import (
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    GeminiCliAgentConfig,
    MiniSweAgentConfig,
    QwenCodeAgentConfig,
)
from dressage.errors import AgentError, SandboxError
from dressage.paddock import ExecResult

CLAUDE_CONFIG_DIR = ".dressage/claude"
CODEX_HOME = ".dressage/codex"
QWEN_HOME = ".dressage/qwen"
MINI_HOME = ".dressage/mini-swe-agent"
GEMINI_HOME = ".dressage/gemini"


def session_root(openai_base_url: str) -> str:
    """``http://h:p/s/<token>`` from the session's OpenAI base ``http://h:p/s/<token>/v1``."""
    url = openai_base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (JSON's escapes are a subset TOML accepts)."""
    return json.dumps(value)


class ClaudeCodeAgent(BlackboxAgent):
    """``claude -p "$DRESSAGE_PROMPT" --output-format json`` with the proxy as its Anthropic API.

    Tools run without prompts only if listed in ``--allowedTools`` (``-p`` mode denies the rest);
    ``--dangerously-skip-permissions`` is not used (Claude Code refuses it as root, and a sandbox
    user does not need it). Every model alias Claude Code may pick for side requests (haiku for
    titles and command checks, subagents) is the run's model, so all its traffic is one policy.
    The answer is the ``result`` of the JSON report on stdout.
    """

    cfg: ClaudeCodeAgentConfig

    def binary(self) -> str | None:
        """The claude executable."""
        return self.cfg.binary

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment plus the Anthropic endpoint, the token and the offline switches."""
        return {
            **super().env(ctx),
            "ANTHROPIC_BASE_URL": session_root(ctx.sandbox_base_url),
            "ANTHROPIC_API_KEY": ctx.token,
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": ctx.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            **self.cfg.env,
        }

    def argv(self, ctx: AgentContext) -> str:
        """``CLAUDE_CONFIG_DIR=... exec claude -p "$DRESSAGE_PROMPT" --output-format json ...``."""
        argv = [
            self.cfg.binary,
            "--output-format",
            "json",
            "--model",
            ctx.model,
            "--allowedTools",
            ",".join(self.cfg.allowed_tools),
        ]
        if self.cfg.max_turns is not None:
            argv += ["--max-turns", str(self.cfg.max_turns)]
        argv += self.cfg.extra_args
        return f'CLAUDE_CONFIG_DIR="$PWD/{CLAUDE_CONFIG_DIR}" exec {shlex.join(argv)} -p "$DRESSAGE_PROMPT"'

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """The ``result`` field of Claude Code's JSON report (an error report is an AgentError)."""
        try:
            report = json.loads(r.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError) as e:
            raise AgentError(
                f"agent claude_code printed no JSON report: {output_tail(ctx, r.stdout)!r}"
            ) from e
        if report.get("is_error"):
            raise AgentError(
                f"agent claude_code reported an error ({report.get('subtype')}): {output_tail(ctx, str(report.get('result')), 500)}"
            )
        return str(report.get("result") or ""), "stdout_json"


class CodexAgent(BlackboxAgent):
    """``codex exec --skip-git-repo-check "$DRESSAGE_PROMPT"`` with the proxy as a Responses provider.

    ``approval_policy = "never"`` and ``sandbox_mode = "danger-full-access"``: our sandbox is the
    boundary (Codex's own Landlock/seccomp sandbox cannot nest in bwrap). The last agent message
    is written to the answer file with ``--output-last-message``.
    """

    cfg: CodexAgentConfig

    def binary(self) -> str | None:
        """The codex executable."""
        return self.cfg.binary

    def config_toml(self, ctx: AgentContext) -> str:
        """``$CODEX_HOME/config.toml``: provider ``dressage`` at the proxy's token-less ``/v1`` URL
        (the token comes from ``OPENAI_API_KEY`` as a Bearer header), offline switches."""
        return "\n".join(
            [
                f"model = {toml_string(ctx.model)}",
                'model_provider = "dressage"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                'web_search = "disabled"',
                "check_for_update_on_startup = false",
                "",
                "[analytics]",
                "enabled = false",
                "",
                "[agents]",
                "enabled = false",
                "",
                "[features]",
                "goals = false",
                "",
                "[model_providers.dressage]",
                'name = "Dressage proxy"',
                f"base_url = {toml_string(bearer_base(ctx))}",
                'env_key = "OPENAI_API_KEY"',
                'wire_api = "responses"',
                "",
            ]
        )

    async def prepare(self, ctx: AgentContext) -> None:
        """Write the config (the token is not in it: Codex reads it from ``OPENAI_API_KEY``)."""
        await ctx.sandbox.write_file(f"{CODEX_HOME}/config.toml", self.config_toml(ctx))

    def argv(self, ctx: AgentContext) -> str:
        """``CODEX_HOME=... exec codex exec --skip-git-repo-check -o <answer> [extra] "$DRESSAGE_PROMPT"``."""
        argv = [
            self.cfg.binary,
            "exec",
            "--skip-git-repo-check",
            "--output-last-message",
            self.cfg.answer_file,
            *self.cfg.extra_args,
        ]
        return f'CODEX_HOME="$PWD/{CODEX_HOME}" exec {shlex.join(argv)} "$DRESSAGE_PROMPT"'


class QwenCodeAgent(BlackboxAgent):
    """``qwen --auth-type openai --approval-mode yolo --output-format json -p "$DRESSAGE_PROMPT"``.

    ``yolo`` approves every tool call (our sandbox is the boundary; Qwen Code's own sandbox is off).
    Its settings and session files live under ``$QWEN_HOME`` (``.dressage/qwen`` in the workspace);
    the token only travels in ``OPENAI_API_KEY``. The answer is the ``result`` of the JSON report
    (the last ``{"type": "result"}`` message on stdout). Shell commands run in its node-pty shell
    (``tools.shell.enableInteractiveShell``): its default child-process runner (0.24.4,
    ``ShellExecutionService.childProcessFallback``) settles a command on the child's ``exit``
    event, which Node may emit before the stdout pipe's last ``data`` events are read, so on a
    loaded machine a command's output could come back empty (2 of 5 fork tests); the pty runner
    waits for the output.
    """

    cfg: QwenCodeAgentConfig
    SETTINGS: dict[str, object] = {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "tools": {"sandbox": False, "shell": {"enableInteractiveShell": True}},
    }

    def binary(self) -> str | None:
        """The qwen executable."""
        return self.cfg.binary

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment (``OPENAI_*`` is Qwen Code's OpenAI auth) plus its offline switches."""
        return {
            **super().env(ctx),
            "QWEN_CODE_DISABLE_WORKFLOWS": "1",
            "NO_BROWSER": "1",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
            **self.cfg.env,
        }

    async def prepare(self, ctx: AgentContext) -> None:
        """Write ``$QWEN_HOME/settings.json`` (no token in it)."""
        settings = {**self.SETTINGS, "model": {"name": ctx.model}}
        await ctx.sandbox.write_file(f"{QWEN_HOME}/settings.json", json.dumps(settings, indent=2))

    def argv(self, ctx: AgentContext) -> str:
        """``QWEN_HOME=... exec qwen --auth-type openai -m M --approval-mode yolo -o json [extra] -p "$DRESSAGE_PROMPT"``."""
        argv = [
            self.cfg.binary,
            "--auth-type",
            "openai",
            "--model",
            ctx.model,
            "--approval-mode",
            "yolo",
            "--output-format",
            "json",
        ]
        if self.cfg.max_turns is not None:
            argv += ["--max-session-turns", str(self.cfg.max_turns)]
        argv += self.cfg.extra_args
        return f'QWEN_HOME="$PWD/{QWEN_HOME}" exec {shlex.join(argv)} -p "$DRESSAGE_PROMPT"'

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """The ``result`` of the report's ``result`` message (an error result is an AgentError)."""
        result = json_result(r.stdout)
        if result is None:
            raise AgentError(f"agent qwen_code printed no JSON result: {output_tail(ctx, r.stdout)!r}")
        if result.get("is_error"):
            raise AgentError(
                f"agent qwen_code reported an error ({result.get('subtype')}): {output_tail(ctx, str(result), 500)}"
            )
        return str(result.get("result") or ""), "stdout_json"


class GeminiCliAgent(BlackboxAgent):
    """``gemini --model M --approval-mode yolo --output-format json -p "$DRESSAGE_PROMPT"``.

    ``yolo`` approves every tool call (our sandbox is the boundary; Gemini CLI's own sandbox is
    off); the workspace is trusted (``GEMINI_CLI_TRUST_WORKSPACE``). Its settings and session files
    live under ``$GEMINI_CLI_HOME`` (``.dressage/gemini`` in the workspace); the token only travels
    in the environment. The answer is the ``response`` of the JSON report on stdout.

    ``context.includeDirectoryTree`` is off: Gemini CLI lists the workspace's directory tree in its
    first request while it writes its own state under ``$GEMINI_CLI_HOME`` (in the workspace), so
    whether ``projects.json.lock/``, ``logs.json`` or ``installation_id`` made it into the listing
    depended on timing; the same session's first request then differed between runs, and a fork's
    branch could not match its parent's turn 0 (``fork_diverged``, 1 of 4 fork tests). Custom
    ignore files (``context.fileFiltering.customIgnoreFilePaths``) do not reach that listing in
    0.61.0, and a ``.geminiignore`` would change the task's workspace.
    """

    cfg: GeminiCliAgentConfig
    SETTINGS: dict[str, object] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "tools": {"sandbox": False},
        "context": {"includeDirectoryTree": False},
    }

    def binary(self) -> str | None:
        """The gemini executable."""
        return self.cfg.binary

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment plus the Gemini endpoint, the token and the offline switches."""
        return {
            **super().env(ctx),
            "GOOGLE_GEMINI_BASE_URL": session_root(ctx.sandbox_base_url),
            "GEMINI_API_KEY": ctx.token,
            "GEMINI_MODEL": ctx.model,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "NO_BROWSER": "1",
            **self.cfg.env,
        }

    async def prepare(self, ctx: AgentContext) -> None:
        """Write ``$GEMINI_CLI_HOME/.gemini/settings.json`` (no token in it)."""
        settings = {**self.SETTINGS, "model": {"name": ctx.model}}
        await ctx.sandbox.write_file(f"{GEMINI_HOME}/.gemini/settings.json", json.dumps(settings, indent=2))

    def argv(self, ctx: AgentContext) -> str:
        """``GEMINI_CLI_HOME=... exec gemini --model M --approval-mode yolo -o json [extra] -p "$DRESSAGE_PROMPT"``."""
        argv = [
            self.cfg.binary,
            "--model",
            ctx.model,
            "--approval-mode",
            "yolo",
            "--output-format",
            "json",
            *self.cfg.extra_args,
        ]
        return f'GEMINI_CLI_HOME="$PWD/{GEMINI_HOME}" exec {shlex.join(argv)} -p "$DRESSAGE_PROMPT"'

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """The ``response`` of the JSON report (a report with an ``error`` is an AgentError)."""
        start = r.stdout.find("{")
        try:
            report, _ = json.JSONDecoder().raw_decode(r.stdout[start:]) if start >= 0 else ({}, 0)
        except json.JSONDecodeError as e:
            raise AgentError(
                f"agent gemini_cli printed no JSON report: {output_tail(ctx, r.stdout)!r}"
            ) from e
        if not isinstance(report, dict) or report.get("error") or "response" not in report:
            raise AgentError(f"agent gemini_cli reported no response: {output_tail(ctx, r.stdout, 500)!r}")
        return str(report.get("response") or ""), "stdout_json"


def json_result(stdout: str) -> dict[str, object] | None:
    """The last ``{"type": "result", ...}`` message of a JSON report: an array of messages, or one
    message per line."""
    text = stdout.strip()
    try:
        parsed = json.loads(text[text.find("[") :]) if text.startswith("[") else None
    except json.JSONDecodeError:
        parsed = None
    messages = parsed if isinstance(parsed, list) else []
    if not messages:
        for line in text.splitlines():
            try:
                messages.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    results = [m for m in messages if isinstance(m, dict) and m.get("type") == "result"]
    return results[-1] if results else None


class MiniSweAgent(BlackboxAgent):
    """``mini -y --exit-immediately -m openai/<model> -c mini.yaml ... -t "$DRESSAGE_PROMPT"``.

    Non-interactive: yolo mode (no confirmations), exits when the agent submits, no cost limit and
    litellm's cost errors ignored (the proxy's model has no price), the first-run wizard skipped
    (``MSWEA_CONFIGURED``), its global config dir and trajectory under ``.dressage/mini-swe-agent``,
    and litellm's price list read from its package, not fetched. The answer is the trajectory's
    ``info.submission``; any other exit status than ``Submitted`` is an :class:`AgentError`.
    """

    cfg: MiniSweAgentConfig
    TRAJECTORY = f"{MINI_HOME}/trajectory.json"

    def binary(self) -> str | None:
        """The mini-swe-agent wrapper."""
        return self.cfg.binary

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment (litellm's ``openai/`` route reads ``OPENAI_*``) plus the offline switches."""
        return {
            **super().env(ctx),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            **self.cfg.env,
        }

    def argv(self, ctx: AgentContext) -> str:
        """``MSWEA_GLOBAL_CONFIG_DIR=... exec mini-swe-agent ... -t "$DRESSAGE_PROMPT"``."""
        argv = [
            self.cfg.binary,
            "--yolo",
            "--exit-immediately",
            "--cost-limit",
            "0",
            "--model",
            f"openai/{ctx.model}",
            "--config",
            "mini.yaml",
            "--config",
            f"agent.step_limit={self.cfg.step_limit}",
            "--output",
            self.TRAJECTORY,
            *self.cfg.extra_args,
        ]
        return f'MSWEA_GLOBAL_CONFIG_DIR="$PWD/{MINI_HOME}" exec {shlex.join(argv)} -t "$DRESSAGE_PROMPT" </dev/null'

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """The trajectory's ``info.submission`` (the run must have ended ``Submitted``)."""
        try:
            info = json.loads(await ctx.sandbox.read_file(self.TRAJECTORY)).get("info") or {}
        except (SandboxError, json.JSONDecodeError, AttributeError) as e:
            raise AgentError(
                f"agent mini_swe_agent left no readable {self.TRAJECTORY}: {e}; {output_tail(ctx, r.stdout)!r}"
            ) from e
        if info.get("exit_status") != "Submitted":
            raise AgentError(
                f"agent mini_swe_agent ended with exit status {info.get('exit_status')!r}, not Submitted: "
                f"{output_tail(ctx, r.stdout, 500)!r}"
            )
        return str(info.get("submission") or ""), "trajectory"
