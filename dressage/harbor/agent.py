"""``harbor run --agent dressage.harbor.agent:Agent``: our whitebox agents in Harbor trials, every model
call through a dressage proxy into the event log.

Options (``--ak key=value``): ``proxy_url`` (a running ``dressage-worker proxy``, default
``http://127.0.0.1:8000``; its admin token is ``DRESSAGE_ADMIN_TOKEN``), ``run`` (the dressage run;
default ``harbor-<job name>``, the job directory's name, so a Harbor job is a run), ``agent`` (an
agent kind, ``answer`` or ``coding``, or a dotted path ``module:Class`` of a whitebox agent),
``max_turns`` and ``max_tokens``. Each trial opens one proxy session in that run with the trial's
name, task and Harbor session in its ``info``; ``python -m dressage.harbor.record JOB_DIR`` then
finalizes the sessions from the trials' ``result.json`` (reward, exception, artifact; see
:mod:`dressage.harbor.record`).

It runs only in :class:`dressage.harbor.environment.Environment`, whose sandbox it hands to the
agent as its tools; the agent is code in this process, so nothing is installed into the sandbox.
"""

from __future__ import annotations

from typing import Any

import httpx
from harbor.agents.base import BaseAgent  # type: ignore[import-not-found,unused-ignore]

from dressage.agents import AgentContext, AgentLog, Task, build_agent
from dressage.agents.config import CodingAgentConfig, PythonAgentConfig
from dressage.config import load_settings
from dressage.errors import AgentError
from dressage.harbor.environment import Environment
from dressage.paddock import SandboxTools
from dressage.tls import tls_context


def run_name_for(environment: Environment) -> str:
    """The default dressage run of a trial: ``harbor-<job directory name>``."""
    return f"harbor-{environment.trial_paths.trial_dir.parent.name}"


def trial_name_of(session_id: str) -> str:
    """Harbor's ``{trial_name}__{role}`` session handle without its role."""
    return session_id.rsplit("__", 1)[0] if "__" in session_id else session_id


class Agent(BaseAgent):  # type: ignore[misc,unused-ignore]
    """A dressage whitebox agent inside a Harbor trial (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        proxy_url: str = "http://127.0.0.1:8000",
        run: str | None = None,
        agent: str = "coding",
        max_turns: int | str = 8,
        max_tokens: int | str = 64,
        **kwargs: Any,
    ) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.run_name = run
        self.agent_spec = agent
        self.max_turns = int(max_turns)
        self.max_tokens = int(max_tokens)
        super().__init__(*args, **kwargs)

    @staticmethod
    def name() -> str:
        """Harbor's name of this agent."""
        return "dressage"

    def version(self) -> str | None:
        """Dressage's version."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("dressage")
        except PackageNotFoundError:
            return None

    async def setup(self, environment: Any) -> None:
        """Nothing to install: the agent runs in this process; only the environment is checked."""
        if not isinstance(environment, Environment):
            raise AgentError(
                "dressage's Harbor agent runs in dressage's environment: "
                "--env dressage.harbor.environment:Environment"
            )

    def _dressage_agent(self) -> Any:
        if ":" in self.agent_spec:
            return build_agent(PythonAgentConfig(path=self.agent_spec))
        if self.agent_spec == "coding":
            return build_agent(CodingAgentConfig(max_turns=self.max_turns))
        if self.agent_spec == "answer":
            from dressage.agents.config import AnswerAgentConfig

            return build_agent(AnswerAgentConfig())
        raise AgentError(f"agent {self.agent_spec!r}: give 'answer', 'coding' or a path 'module:Class'")

    async def run(self, instruction: str, environment: Any, context: Any) -> None:
        """Open a proxy session for this trial and play the task with the dressage agent."""
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        await self.setup(environment)
        sandbox = environment.sandbox
        if sandbox is None:
            raise AgentError("the environment is not started")
        run = self.run_name or run_name_for(environment)
        trial = trial_name_of(environment.session_id)
        settings = load_settings()
        token = settings.admin_token
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        agent = self._dressage_agent()
        timeout = httpx.Timeout(60, connect=settings.proxy_connect_timeout_s)
        async with httpx.AsyncClient(
            base_url=self.proxy_url, headers=headers, timeout=timeout, verify=tls_context()
        ) as http:
            r = await http.post("/admin/runs", json={"name": run, "config": {"harbor_job": run}})
            r.raise_for_status()
            info = {
                "trial_name": trial,
                "task": environment.environment_name,
                "harbor_session": environment.session_id,
            }
            r = await http.post(
                "/admin/sessions",
                json={
                    "run": run,
                    "agent": f"harbor:{agent.name}",
                    "sandbox": environment.type(),
                    "info": info,
                },
            )
            r.raise_for_status()
            handle = r.json()
        client = AsyncOpenAI(
            base_url=handle["base_url"],
            api_key=handle["token"],
            max_retries=2,
            http_client=DefaultAsyncHttpxClient(verify=tls_context()),
        )
        log = AgentLog()
        ctx = AgentContext(
            task=Task(index=0, id=environment.environment_name, prompt=instruction),
            client=client,
            model=self.model_name or "dressage",
            sandbox=sandbox,
            tools=SandboxTools(sandbox),
            session_id=handle["session_id"],
            token=handle["token"],
            sandbox_base_url=handle["base_url"],
            sampling={"max_tokens": self.max_tokens},
            log=log,
        )
        try:
            result = await agent.run(ctx)
        finally:
            await client.close()
            (self.logs_dir / "dressage-agent.log").write_text(log.text())
        context.metadata = {
            "dressage_run": run,
            "dressage_session": handle["session_id"],
            "turns": result.turns,
            "finish_reason": result.finish_reason,
            "answer": result.answer[:2000],
        }
