"""The oracle agent (``agent: {kind: oracle}``): runs a Harbor task's ``solution/solve.sh``.

It checks a dataset's solvability without a model: the solution files are written to ``/solution``
and ``solve.sh`` runs from the task's working directory with ``[solution] env`` under the task's
agent timeout, its output going to ``/logs/agent/oracle.txt`` and the agent log. It makes no model
call, so its sessions have no turns (nothing to train on); their rewards say whether the tests pass
on the reference solution.
"""

from __future__ import annotations

import shlex

from dressage.agents.base import Agent, AgentContext, AgentResult
from dressage.errors import AgentError
from dressage.harbor.sandbox import SOLUTION_DIR
from dressage.harbor.tasks import harbor_info


class OracleAgent(Agent):
    """Runs ``solution/solve.sh`` of a Harbor task (see the module docstring)."""

    name = "oracle"

    async def run(self, ctx: AgentContext) -> AgentResult:
        """Write the solution, run it, and answer with its output's tail."""
        info = harbor_info(ctx.task)
        if info is None or "solve.sh" not in (info.get("solution") or {}):
            raise AgentError(
                f"task {ctx.task.id or ctx.task.index} has no solution/solve.sh: the oracle runs Harbor tasks' solutions"
            )
        for rel, text in info["solution"].items():
            await ctx.sandbox.write_file(f"{SOLUTION_DIR}/{rel}", text)
        workdir = shlex.quote(str(info["workdir"]))
        r = await ctx.sandbox.exec(
            f"mkdir -p /logs/agent && cd {workdir} && chmod +x /solution/solve.sh && "
            "(/solution/solve.sh) > /logs/agent/oracle.txt 2>&1; s=$?; cat /logs/agent/oracle.txt; exit $s",
            env=dict(info.get("solution_env") or {}),
            timeout=min(float(info["agent_timeout_s"]), ctx.timeout_s),
        )
        ctx.log.write(f"oracle: solve.sh exited {r.exit_code}{' (timed out)' if r.timed_out else ''}")
        ctx.log.write(r.stdout[-4000:])
        return AgentResult(
            answer=r.stdout[-2000:],
            finish_reason="solved" if r.ok else "solve_failed",
            info={"exit_code": r.exit_code, "timed_out": r.timed_out},
        )
