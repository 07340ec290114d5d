"""Vendor agent CLIs that speak their vendor's own API dialect, pointed at the proxy's routes for it.

- **Claude Code** (``claude``) speaks only the Anthropic Messages API: it appends
  ``/v1/messages?beta=true`` to ``ANTHROPIC_BASE_URL``, so the base is the session's root
  ``http://127.0.0.1:<port>/s/<token>`` and the token goes in ``x-api-key`` (``ANTHROPIC_API_KEY``).
- **Codex** (``codex``) speaks only the OpenAI Responses API (``wire_api = "responses"``; ``"chat"`` is
  refused by 0.169): a ``model_provider`` in ``$CODEX_HOME/config.toml`` with the proxy's ``/v1``
  URL as ``base_url`` and ``OPENAI_API_KEY`` (the token, sent as a Bearer header) as ``env_key``.
  The URL has no token in its path: the config file lives in the workspace, which is archived.

Both run with the sandbox as the only boundary (network off, the proxy reached through the
Unix-socket forwarder) and keep their state under ``.dressage/`` in the workspace. The switches in
each ``env`` / config keep them offline: no update checks, telemetry, error reports, web search.
"""

from __future__ import annotations

import json
import shlex

from dressage.agents.base import AgentContext
from dressage.agents.blackbox import BlackboxAgent, bearer_base, output_tail
from dressage.agents.config import ClaudeCodeAgentConfig, CodexAgentConfig
from dressage.errors import AgentError
from dressage.paddock import ExecResult

CLAUDE_CONFIG_DIR = ".dressage/claude"
CODEX_HOME = ".dressage/codex"


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
