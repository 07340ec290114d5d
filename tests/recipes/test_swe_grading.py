"""The SWE reward on real bubblewrap sandboxes: the gold patch scores 1, no change or a wrong one 0,
and an edited test scores 0 with the reason recorded (the integrity check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("swebench", "the SWE recipe needs the 'swe' extra")

from dressage.agents import AgentResult, Task  # noqa: E402
from dressage.paddock import Sandbox, SandboxSpec, get_provider  # noqa: E402
from dressage.rollout.rewards import RewardInput  # noqa: E402
from recipes.swe.agent import oracle_command  # noqa: E402
from recipes.swe.loader import SWE_KIND, load_tasks, record_of  # noqa: E402
from recipes.swe.records import patch_paths  # noqa: E402
from recipes.swe.reward import score  # noqa: E402
from tests.paddock.conftest import requires_bwrap  # noqa: E402
from tests.recipes.swe_fixtures import requires_sandbox_pytest, swe_data  # noqa: E402

pytestmark = [requires_bwrap, requires_sandbox_pytest, pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sample's records file, its repositories built beside it."""
    return swe_data(tmp_path, monkeypatch)


async def _score_after(task: Task, command: str) -> tuple[float, dict]:
    provider = get_provider("bwrap")
    spec = SWE_KIND.sandbox_spec(SandboxSpec(provider="bwrap", timeout_s=60.0), task, {})
    made: list[Sandbox] = []

    async def fresh() -> Sandbox:
        sb = await provider.create(f"swe-verifier-{len(made)}", spec)
        made.append(sb)
        return sb

    sandbox = await provider.create("swe-agent", spec)
    try:
        r = await sandbox.exec(["bash", "-c", command])
        assert r.exit_code == 0, r.stderr
        out = await score(RewardInput(task, "", AgentResult(""), sandbox, fresh))
    finally:
        await sandbox.terminate()
    return out.reward, out.details


async def test_gold_patch_resolves_every_sample_instance(records: Path) -> None:
    for task in load_tasks(records, None):
        reward, details = await _score_after(task, oracle_command(record_of(task).patch, "correct", None))
        assert (reward, details["status"], details["integrity"]) == (1.0, "RESOLVED_FULL", "ok"), details
        assert details["graded_in"] == "fresh sandbox"


async def test_no_change_and_a_wrong_fix_score_zero(records: Path) -> None:
    task = load_tasks(records, 2)[1]  # intervalkit: `<` must become `<=`
    reward, details = await _score_after(task, "true")
    assert (reward, details["status"]) == (0.0, "EMPTY_PATCH")
    wrong = "sed -i 's/max(last_end, end)/last_end/' intervalkit/core.py"  # breaks overlapping merges
    reward, details = await _score_after(task, wrong)
    assert (reward, details["status"]) == (0.0, "RESOLVED_NO"), details
    report = details["report"]
    assert "tests/test_core.py::test_merge_touching" in report["FAIL_TO_PASS"]["failure"]
    assert report["PASS_TO_PASS"]["failure"] == ["tests/test_core.py::test_merge_overlapping"]
    reward, details = await _score_after(task, oracle_command(record_of(task).patch, "wrong", None))
    assert (reward, details["status"], details["integrity"]) == (0.0, "RESOLVED_NO", "ok")
    assert details["report"]["PASS_TO_PASS"]["failure"] == []


async def test_an_edited_test_scores_zero_and_says_so(records: Path) -> None:
    task = load_tasks(records, 1)[0]
    record = record_of(task)
    test_file = patch_paths(record.test_patch)[0]
    reward, details = await _score_after(task, oracle_command(record.patch, "tamper", test_file))
    assert (reward, details["integrity"], details["status"]) == (0.0, "failed", "INTEGRITY_FAILED")
    assert f"M {test_file}: a file of the test patch" in details["reason"]
    reward, details = await _score_after(
        task, oracle_command(record.patch, "correct", None) + "\necho 'import sys' > conftest.py"
    )
    assert (reward, details["integrity"]) == (0.0, "failed")
    assert "A conftest.py: a file that controls how the tests run" in details["reason"]
