"""Blackbox adapters: run an existing agent program inside the sandbox, pointed at the proxy.

Every adapter runs one command in the session's sandbox with this environment (on top of the
sandbox's clean one):

- ``OPENAI_BASE_URL`` (and ``OPENAI_API_BASE``): the session's OpenAI-compatible URL as seen from
  inside the sandbox, e.g. ``http://127.0.0.1:18080/s/<token>/v1`` through the Unix-socket
  forwarder when the sandbox has no network;
- ``OPENAI_API_KEY``: the session's bearer token; ``OPENAI_MODEL``: the model name to request;
- the run's ``secrets.agent`` variables, valued from the worker's environment (see
  :mod:`dressage.rollout.secrets`);
- ``DRESSAGE_PROMPT`` / ``DRESSAGE_PROMPT_FILE``: the task's prompt (also written to
  ``.dressage/prompt.txt`` in the workspace); ``DRESSAGE_ANSWER_FILE``: where the program may write
  its final answer (otherwise its stdout is the answer).

A program that is missing, exits with an unexpected code or runs past the session timeout raises
:class:`~dressage.errors.AgentError`, which the worker records as a failed attempt.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from dressage.agents.base import Agent, AgentContext, AgentResult
from dressage.agents.config import CommandAgentConfig, OpenClawAgentConfig, OpenCodeAgentConfig
from dressage.errors import AgentError, SandboxError

PROMPT_FILE = ".dressage/prompt.txt"
TAIL_CHARS = 2000


class BlackboxAgent(Agent):
    """Shared machinery: binary check, environment, one sandboxed exec, answer collection."""

    def __init__(self, cfg: CommandAgentConfig | OpenCodeAgentConfig | OpenClawAgentConfig) -> None:
        self.cfg = cfg
        self.name = cfg.kind

    def argv(self, ctx: AgentContext) -> list[str] | str:
        """The command to run (argv list, or a string for ``/bin/sh -c``)."""
        raise NotImplementedError

    def binary(self) -> str | None:
        """The program that must exist in the sandbox, or None when it cannot be known up front."""
        return None

    async def prepare(self, ctx: AgentContext) -> None:
        """Write config files the program needs into the workspace (none by default)."""

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """The environment described in the module docstring, plus the config's ``env``."""
        return {
            "OPENAI_BASE_URL": ctx.sandbox_base_url,
            "OPENAI_API_BASE": ctx.sandbox_base_url,
            "OPENAI_API_KEY": ctx.token,
            "OPENAI_MODEL": ctx.model,
            "DRESSAGE_PROMPT": ctx.task.prompt_text(),
            "DRESSAGE_PROMPT_FILE": PROMPT_FILE,
            "DRESSAGE_ANSWER_FILE": self.cfg.answer_file,
            "DRESSAGE_SESSION_ID": ctx.session_id,
            **self.cfg.env,
            **ctx.secret_env,
        }

    async def _check_binary(self, ctx: AgentContext) -> None:
        binary = self.binary()
        if not binary:
            return
        r = await ctx.sandbox.exec(["/bin/sh", "-c", 'command -v "$0"', binary], timeout=30)
        if not r.ok:
            raise AgentError(
                f"agent binary {binary!r} not found in the sandbox (PATH={ctx.sandbox.spec.env.get('PATH', 'default')}): "
                "install it where the sandbox can see it (under /usr for bwrap, in the template for e2b)"
            )

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Check the binary, write files, run the program once, collect its answer."""
        await self._check_binary(ctx)
        await ctx.sandbox.write_file(PROMPT_FILE, ctx.task.prompt_text())
        await self.prepare(ctx)
        argv = self.argv(ctx)
        shown = argv if isinstance(argv, str) else shlex.join(argv)
        ctx.log.write(f"$ {shown}")
        r = await ctx.sandbox.exec(argv, env=self.env(ctx), timeout=ctx.timeout_s)
        ctx.log.write(f"exit_code={r.exit_code} timed_out={r.timed_out} duration={r.duration_s:.2f}s")
        ctx.log.write("--- stdout ---\n" + r.stdout)
        ctx.log.write("--- stderr ---\n" + r.stderr)
        if r.timed_out:
            raise AgentError(f"agent {self.name} ran past its timeout of {ctx.timeout_s:g}s and was killed")
        if r.exit_code == 127 and 127 not in self.cfg.accept_exit_codes:
            raise AgentError(
                f"agent {self.name}: command not found in the sandbox (exit 127): {r.stderr.strip()[-300:]}"
            )
        if r.exit_code not in self.cfg.accept_exit_codes:
            raise AgentError(
                f"agent {self.name} exited with code {r.exit_code}: {r.stderr.strip()[-TAIL_CHARS:] or r.stdout.strip()[-TAIL_CHARS:]}"
            )
        try:
            answer = (await ctx.sandbox.read_file(self.cfg.answer_file)).decode("utf-8", errors="replace")
            source = "answer_file"
        except SandboxError:
            answer, source = r.stdout, "stdout"
        return AgentResult(
            answer=answer.strip(),
            finish_reason="exited",
            info={"exit_code": r.exit_code, "answer_source": source, "duration_s": r.duration_s},
        )


class CommandAgent(BlackboxAgent):
    """Any CLI that reads ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``."""

    cfg: CommandAgentConfig

    def argv(self, ctx: AgentContext) -> list[str] | str:
        """The configured command, unchanged (read the prompt from ``$DRESSAGE_PROMPT``)."""
        return self.cfg.command if isinstance(self.cfg.command, str) else list(self.cfg.command)

    def binary(self) -> str | None:
        """argv[0] for a list command; a shell string is not checked up front (exit 127 still is)."""
        return self.cfg.command[0] if isinstance(self.cfg.command, list) else None


class OpenCodeAgent(BlackboxAgent):
    """opencode: an ``opencode.json`` declaring the proxy as provider ``dressage``, then ``opencode run``.

    Fully offline: ``@ai-sdk/openai-compatible`` is bundled in opencode's binary (nothing is fetched
    from npm), and the switches in :meth:`env` turn off the models.dev catalog, autoupdate, LSP
    downloads, sharing and the default (npm-installed) plugins. opencode always streams
    (``"stream": true``) and needs about 0.5 GB of memory for one turn, so a sandbox with
    ``memory_mb`` of 512 or less gets it OOM-killed (exit 137); keep the default 2048.
    """

    cfg: OpenCodeAgentConfig

    def binary(self) -> str | None:
        """The opencode executable."""
        return self.cfg.binary

    async def prepare(self, ctx: AgentContext) -> None:
        """Write ``opencode.json`` (OpenAI-compatible provider at the session URL, autoupdate off)."""
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"dressage/{ctx.model}",
            "provider": {
                "dressage": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Dressage proxy",
                    "options": {"baseURL": ctx.sandbox_base_url, "apiKey": ctx.token},
                    "models": {ctx.model: {"name": ctx.model}},
                }
            },
        }
        await ctx.sandbox.write_file("opencode.json", json.dumps(config, indent=2))

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment plus switches that keep opencode offline."""
        return {
            **super().env(ctx),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            **self.cfg.env,
        }

    def argv(self, ctx: AgentContext) -> str:
        """``exec opencode run --model dressage/<model> [extra] < $DRESSAGE_PROMPT_FILE``.

        The prompt goes in on stdin: ``opencode run`` wraps a message argument that contains spaces
        in double quotes (escaping inner ones), so the model would not see the task's exact text.
        """
        argv = [self.cfg.binary, "run", "--model", f"dressage/{ctx.model}", *self.cfg.extra_args]
        return f'exec {shlex.join(argv)} <"$DRESSAGE_PROMPT_FILE"'


class OpenClawAgent(BlackboxAgent):
    """openclaw: non-interactive onboarding of a custom OpenAI-compatible provider, then one local turn."""

    cfg: OpenClawAgentConfig

    def binary(self) -> str | None:
        """The openclaw executable."""
        return self.cfg.binary

    def argv(self, ctx: AgentContext) -> str:
        """A shell line: ``openclaw onboard ... && openclaw agent --local --message "$DRESSAGE_PROMPT"``."""
        b = shlex.quote(self.cfg.binary)
        extra = shlex.join(self.cfg.extra_args)
        return (
            f"{b} onboard --non-interactive --mode local --auth-choice custom-api-key "
            '--custom-base-url "$OPENAI_BASE_URL" --custom-model-id "$OPENAI_MODEL" '
            '--custom-api-key "$OPENAI_API_KEY" --custom-provider-id dressage '
            "--custom-compatibility openai --secret-input-mode plaintext --skip-skills "
            f'--workspace "$PWD" >.dressage/onboard.log 2>&1 && '
            f'exec {b} agent --local --message "$DRESSAGE_PROMPT" {extra}'
        ).strip()
