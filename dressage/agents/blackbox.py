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
from collections.abc import Iterable
from typing import Any

from dressage.agents.base import Agent, AgentContext, AgentResult, ResumePoint
from dressage.agents.cli_resume import (
    RESUME_INPUT_ENV,
    CliResumeMode,
    NoResume,
    ResumeCommand,
    resume_mode,
)
from dressage.agents.config import (
    BlackboxConfig,
    CommandAgentConfig,
    OpenClawAgentConfig,
    OpenCodeAgentConfig,
)
from dressage.errors import AgentError, SandboxError
from dressage.paddock import ExecResult
from dressage.redact import redacted_tail

PROMPT_FILE = ".dressage/prompt.txt"
TAIL_CHARS = 2000


class BlackboxAgent(Agent):
    """Shared machinery: binary check, environment, one sandboxed exec, answer collection."""

    def __init__(self, cfg: BlackboxConfig) -> None:
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
        return await self.execute(ctx, self.argv(ctx), self.env(ctx))

    def resume_mode(self) -> CliResumeMode | NoResume:
        """This CLI's own resume mode (:mod:`dressage.agents.cli_resume`), or why it has none."""
        return resume_mode(self.cfg.kind)

    def resume_refusal(self, point: ResumePoint) -> str | None:
        """Why this CLI does not start from ``point`` (a checkpoint's fork or take-over replays it,
        recording this): its own resume mode (docs/rollout.md "Resume modes") always sends the
        restored conversation followed by new messages, so its first request is never request K
        as recorded, and with one prompt per run the only user-turn boundary is turn 0."""
        mode = self.resume_mode()
        if isinstance(mode, NoResume):
            return mode.reason
        return (
            f"agent {self.name}: {mode.kind}'s own resume mode appends {mode.appends} to the restored "
            f"conversation, so its first request cannot be request {point.turn_index} as recorded; "
            "a resume starts its CLI again from the prompt"
        )

    async def resume_command(self, ctx: AgentContext, next_input: str) -> ResumeCommand | NoResume:
        """How to start this CLI in its resume mode in ``ctx.sandbox``, whose workspace a checkpoint
        restored (it must hold :attr:`CliResumeMode.session_paths`), with ``next_input`` as the user
        input the resumed CLI sends; a :class:`NoResume` (the caller replays, recording its reason)
        for a CLI without one or when its session file is missing."""
        mode = self.resume_mode()
        if isinstance(mode, NoResume):
            return mode
        argv = self.argv(ctx)
        if not isinstance(argv, str):
            return NoResume(self.cfg.kind, f"agent {self.name}'s command is no shell line to resume")
        return await mode.command(ctx.sandbox, argv, next_input)

    async def run_resumed(self, ctx: AgentContext, command: ResumeCommand) -> AgentResult:
        """Run a :meth:`resume_command` (after :meth:`prepare`, which rewrites the CLI's config for
        this session's proxy URL) and collect the answer as :meth:`run` does."""
        await self._check_binary(ctx)
        await ctx.sandbox.write_file(PROMPT_FILE, ctx.task.prompt_text())
        await self.prepare(ctx)
        return await self.execute(ctx, command.argv, {**self.env(ctx), RESUME_INPUT_ENV: command.next_input})

    async def execute(self, ctx: AgentContext, argv: list[str] | str, env: dict[str, str]) -> AgentResult:
        """Run the agent's command once with ``env``; check its exit; collect its answer."""
        shown = argv if isinstance(argv, str) else shlex.join(argv)
        ctx.log.write(f"$ {shown}")
        r = await ctx.sandbox.exec(argv, env=env, timeout=ctx.timeout_s)
        ctx.log.write(f"exit_code={r.exit_code} timed_out={r.timed_out} duration={r.duration_s:.2f}s")
        ctx.log.write("--- stdout ---\n" + r.stdout)
        ctx.log.write("--- stderr ---\n" + r.stderr)
        if r.timed_out:
            raise AgentError(f"agent {self.name} ran past its timeout of {ctx.timeout_s:g}s and was killed")
        if r.exit_code == 127 and 127 not in self.cfg.accept_exit_codes:
            raise AgentError(
                f"agent {self.name}: command not found in the sandbox (exit 127): {output_tail(ctx, r.stderr)}"
            )
        if r.exit_code not in self.cfg.accept_exit_codes:
            detail = failure_detail(r, ctx.secret_env.values())
            raise AgentError(f"agent {self.name} exited with code {r.exit_code}: {detail}")
        answer, source = await self.collect_answer(ctx, r)
        return AgentResult(
            answer=answer.strip(),
            finish_reason="exited",
            info={"exit_code": r.exit_code, "answer_source": source, "duration_s": r.duration_s},
        )

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """``(answer, source)``: the answer file if the program wrote it, else its stdout."""
        try:
            answer = (await ctx.sandbox.read_file(self.cfg.answer_file)).decode("utf-8", errors="replace")
            return answer, "answer_file"
        except SandboxError:
            return r.stdout, "stdout"

    async def exec_step(self, ctx: AgentContext, argv: str, what: str) -> ExecResult:
        """Run a set-up step (not the agent's turn) with the agent's environment; fail loudly."""
        ctx.log.write(f"$ {argv}")
        r = await ctx.sandbox.exec(argv, env=self.env(ctx), timeout=ctx.timeout_s)
        ctx.log.write(f"{what}: exit_code={r.exit_code} duration={r.duration_s:.2f}s")
        if r.timed_out or r.exit_code != 0:
            tail = output_tail(ctx, r.stderr.strip() or r.stdout, TAIL_CHARS)
            ctx.log.write(tail)
            raise AgentError(
                f"agent {self.name}: {what} failed (exit {r.exit_code}, timed_out={r.timed_out}): {tail}"
            )
        return r


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
        config: dict[str, object] = {
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
    """openclaw: non-interactive onboarding of a custom OpenAI-compatible provider, then one local turn.

    Measured with openclaw 2026.9.6 (it needs Node >= 24): onboarding exits 1 without
    ``--accept-risk`` and waits for a gateway unless ``--skip-health``; every other set-up step
    (channels, daemon, search, UI, hooks, skills, workspace bootstrap files) is skipped. The base URL
    stored is the proxy's token-less ``/v1`` URL and the API key the reference ``${OPENAI_API_KEY}``
    (openclaw substitutes it when it loads its config; it is sent as a Bearer header), so the
    session token never lands in the workspace. After onboarding, :data:`OFFLINE`
    is merged into ``~/.openclaw/openclaw.json`` on the host side (an ``openclaw config set`` costs
    another CLI start-up): the memory plugin slot is emptied (its vector index otherwise calls an
    external embeddings host), web search and update checks are off. The answer is the text of the
    ``payloads`` in ``openclaw agent --local --json``'s report.
    """

    cfg: OpenClawAgentConfig

    CONFIG = ".openclaw/openclaw.json"
    OFFLINE: dict[str, object] = {
        "plugins": {"slots": {"memory": "none"}},
        "tools": {"web": {"search": {"enabled": False}}},
        "update": {"checkOnStart": False},
    }

    def binary(self) -> str | None:
        """The openclaw executable."""
        return self.cfg.binary

    def env(self, ctx: AgentContext) -> dict[str, str]:
        """Base environment, the token-less base URL the config stores, and openclaw's switch for a
        host without LAN discovery."""
        return {
            **super().env(ctx),
            "DRESSAGE_BEARER_BASE_URL": bearer_base(ctx),
            "OPENCLAW_DISABLE_BONJOUR": "1",
            **self.cfg.env,
        }

    def onboard_argv(self) -> str:
        """The onboarding command line (reads the session from the environment)."""
        b = shlex.quote(self.cfg.binary)
        return (
            f"{b} onboard --non-interactive --accept-risk --mode local --auth-choice custom-api-key "
            '--custom-base-url "$DRESSAGE_BEARER_BASE_URL" --custom-model-id "$OPENAI_MODEL" '
            "--custom-api-key '${OPENAI_API_KEY}' --custom-provider-id dressage "
            "--custom-compatibility openai --secret-input-mode plaintext --skip-health --skip-channels "
            "--skip-daemon --skip-search --skip-ui --skip-hooks --skip-skills --skip-bootstrap "
            '--workspace "$PWD"'
        )

    async def prepare(self, ctx: AgentContext) -> None:
        """Onboard, then merge :data:`OFFLINE` into the config it wrote."""
        await self.exec_step(ctx, self.onboard_argv(), "openclaw onboarding")
        try:
            config = json.loads(await ctx.sandbox.read_file(self.CONFIG))
        except (SandboxError, json.JSONDecodeError) as e:
            raise AgentError(f"agent openclaw: onboarding left no readable {self.CONFIG}: {e}") from e
        await ctx.sandbox.write_file(self.CONFIG, json.dumps(deep_merge(config, self.OFFLINE), indent=2))

    def argv(self, ctx: AgentContext) -> str:
        """``exec openclaw agent --local --json --message "$DRESSAGE_PROMPT" [extra]``."""
        argv = [self.cfg.binary, "agent", "--local", "--json", *self.cfg.extra_args]
        return f'exec {shlex.join(argv)} --message "$DRESSAGE_PROMPT"'

    async def collect_answer(self, ctx: AgentContext, r: ExecResult) -> tuple[str, str]:
        """The texts of the JSON report's ``payloads`` (the report is the last JSON object printed)."""
        start = r.stdout.find("{")
        try:
            report, _ = json.JSONDecoder().raw_decode(r.stdout[start:]) if start >= 0 else ({}, 0)
        except json.JSONDecodeError as e:
            raise AgentError(f"agent openclaw printed no JSON report: {output_tail(ctx, r.stdout)!r}") from e
        payloads = report.get("payloads") if isinstance(report, dict) else None
        if not isinstance(payloads, list):
            raise AgentError(f"agent openclaw's report has no payloads: {output_tail(ctx, r.stdout)!r}")
        return "\n".join(str(p.get("text", "")) for p in payloads if isinstance(p, dict)), "stdout_json"


def bearer_base(ctx: AgentContext) -> str:
    """The session's OpenAI base without the token in its path (``http://h:p/v1``): for CLIs that
    store their base URL in a config file, so the token travels only as a Bearer header from the
    environment and never lands in the workspace."""
    return ctx.sandbox_base_url.replace(f"/s/{ctx.token}/", "/", 1)


def output_tail(ctx: AgentContext, text: str, max_chars: int = 300) -> str:
    """The end of a program's output for an error message, redacted before it is cut."""
    return redacted_tail(text.strip(), max_chars, ctx.secret_env.values())


def failure_detail(r: ExecResult, secrets: Iterable[str] = ()) -> str:
    """The tail of stderr, then of stdout (CLIs such as Claude Code report API errors on stdout),
    redacted before it is cut (see :func:`~dressage.redact.redacted_tail`)."""
    secrets = tuple(secrets)
    err = redacted_tail(r.stderr.strip(), TAIL_CHARS, secrets)
    out = redacted_tail(r.stdout.strip(), TAIL_CHARS // 2, secrets)
    return f"{err} | stdout: {out}" if err and out else err or out or "it printed nothing on stderr or stdout"


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, object]:
    """``base`` with ``patch`` merged in: nested objects merge, anything else is replaced."""
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
