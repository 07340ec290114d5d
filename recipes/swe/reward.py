"""The SWE reward: the agent's change, the integrity check, then SWE-bench's grading of the tests.

``reward: {kind: python, path: recipes.swe.reward:score, options: {...}}``. In order:

1. the agent's change is the diff of its workspace against ``base_commit`` (new files included,
   the agent adapters' own files left out: :data:`recipes.swe.integrity.ADAPTER_FILES`);
2. a change that touches the tests or the grading files scores 0, with ``integrity: failed`` and
   the reason in the details (:mod:`recipes.swe.integrity`);
3. the change is applied to a fresh checkout in a new sandbox (the agent's sandbox may hold
   anything: processes, ignored files, a rewritten ``.git``), ``test_patch`` is applied by the eval
   script, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` run, and SWE-bench's parser and resolution rules
   decide (:mod:`recipes.swe.grading`): 1.0 when resolved (``RESOLVED_FULL``), else 0.0.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from dressage.paddock import Sandbox
from dressage.redact import redacted_tail
from dressage.rollout.rewards import RewardInput, RewardOutput
from recipes.extras import require
from recipes.swe.grading import DEFAULT_LOG_PARSER, DEFAULT_TEST_CMD, grade_log, test_spec
from recipes.swe.integrity import ADAPTER_FILES, GRADING_FILES, TEST_FILES, parse_name_status, violations
from recipes.swe.loader import record_of
from recipes.swe.records import SweRecord

MODEL_PATCH = ".git/dressage-model.patch"
"""Inside ``.git``: never part of the work tree git diffs."""
EVAL_SCRIPT = ".git/dressage-eval.sh"
EVAL_LOG = ".git/dressage-eval.log"
TAIL_CHARS = 4000

require("swebench", "swe")  # a missing extra stops the run at config load, naming it (a cheap import)


def _pathspec(exclude: Sequence[str]) -> str:
    return " ".join(["."] + [shlex.quote(f":(exclude,top){p}") for p in exclude])


async def agent_change(sandbox: Sandbox, record: SweRecord, exclude: Sequence[str]) -> tuple[str, str] | str:
    """``(patch, name_status)`` of the workspace against ``base_commit``, or why there is none."""
    spec = _pathspec(exclude)
    base = shlex.quote(record.base_commit)
    cmd = (
        f"git add -A -- {spec} && git diff --cached --binary --no-renames {base} -- {spec} > {MODEL_PATCH}"
        f" && git diff --cached --name-status -z --no-renames {base} -- {spec}"
    )
    r = await sandbox.exec(["bash", "-c", cmd], timeout=120)
    if not r.ok:
        return f"git could not diff the workspace against {record.base_commit}: {r.stderr.strip()[-300:]}"
    patch = (await sandbox.read_file(MODEL_PATCH)).decode("utf-8", errors="replace")
    return patch, r.stdout


async def run_eval(sandbox: Sandbox, patch: str, spec: Any, timeout_s: float) -> str | None:
    """Apply ``patch`` in ``sandbox`` (a fresh checkout) and run the eval script; its log, or None
    when the patch does not apply (SWE-bench's ``git apply`` then ``patch --fuzz`` fallbacks)."""
    await sandbox.write_file(MODEL_PATCH, patch)
    apply = (
        f"git apply -v {MODEL_PATCH} || git apply -v --reject {MODEL_PATCH} "
        f"|| patch --batch --fuzz=5 -p1 -i {MODEL_PATCH}"
    )
    r = await sandbox.exec(["bash", "-c", apply], timeout=120)
    if not r.ok:
        return None
    await sandbox.write_file(EVAL_SCRIPT, spec.eval_script)
    r = await sandbox.exec(["bash", "-c", f"bash {EVAL_SCRIPT} > {EVAL_LOG} 2>&1"], timeout=timeout_s)
    log = (await sandbox.read_file(EVAL_LOG)).decode("utf-8", errors="replace")
    if r.timed_out:
        log += "\n" + require("swebench.harness.constants", "swe").TESTS_TIMEOUT + "\n"
    return log


async def _graded(
    inp: RewardInput, record: SweRecord, patch: str, spec: Any, timeout_s: float
) -> tuple[str | None, str]:
    """The eval log in a fresh sandbox (or, without one, the agent's own reset to ``base_commit``)."""
    if inp.fresh_sandbox is None:
        base = shlex.quote(record.base_commit)
        await inp.sandbox.exec(["bash", "-c", f"git reset -q --hard {base} && git clean -qffdx"], timeout=120)
        return await run_eval(inp.sandbox, patch, spec, timeout_s), "agent sandbox, reset"
    fresh = await inp.fresh_sandbox()
    try:
        return await run_eval(fresh, patch, spec, timeout_s), "fresh sandbox"
    finally:
        await fresh.terminate()


async def score(
    inp: RewardInput,
    timeout_s: float = 600.0,
    test_cmd: str = DEFAULT_TEST_CMD,
    log_parser: str = DEFAULT_LOG_PARSER,
    grading_files: Sequence[str] = GRADING_FILES,
    test_files: Sequence[str] = TEST_FILES,
    exclude: Sequence[str] = ADAPTER_FILES,
) -> RewardOutput:
    """The reward of one SWE episode (see the module docstring); options are the keyword arguments."""
    record = record_of(inp.task)
    spec = test_spec(record, test_cmd, log_parser)
    change = await agent_change(inp.sandbox, record, exclude)
    if isinstance(change, str):
        return RewardOutput(0.0, {"integrity": "unknown", "status": "NO_PATCH", "reason": change})
    patch, name_status = change
    details: dict[str, Any] = {
        "instance_id": record.instance_id,
        "model_patch": redacted_tail(patch, TAIL_CHARS),
    }
    bad = violations(parse_name_status(name_status), record, grading_files, test_files)
    if bad:
        reason = "the run edited the tests or the grading files: " + "; ".join(bad)
        return RewardOutput(
            0.0, {**details, "integrity": "failed", "status": "INTEGRITY_FAILED", "reason": reason}
        )
    details["integrity"] = "ok"
    if not patch.strip():
        return RewardOutput(0.0, {**details, "status": "EMPTY_PATCH", "reason": "the run changed nothing"})
    log, where = await _graded(inp, record, patch, spec, timeout_s)
    if log is None:
        return RewardOutput(0.0, {**details, "status": "PATCH_APPLY_FAILED", "graded_in": where})
    verdict = grade_log(spec, log)
    return RewardOutput(
        1.0 if verdict["resolved"] else 0.0,
        {**details, **verdict, "graded_in": where, "log_tail": redacted_tail(log, TAIL_CHARS)},
    )
