"""Grading an instance the SWE-bench way, with the SWE-bench package's own code.

A record that carries SWE-bench 5's ``eval_script`` and ``log_parser`` is graded with them as is.
One that does not (the SWE-bench and SWE-Gym datasets on the Hub before that) gets an eval script
in the same shape as SWE-bench's: restore the test files ``test_patch`` touches to ``base_commit``,
apply ``test_patch``, run the test command (the record's ``test_cmd`` or the reward's) on those
files between SWE-bench's output markers, restore the test files again. Then
``swebench.harness.utils.make_test_spec`` builds the ``TestSpec`` (it makes the script record the
test command's exit status), ``swebench.harness.grading.get_logs_eval`` parses the log with the
parser of ``PARSER_REGISTRY`` the record names (``parse_log_pytest`` by default), and
``get_eval_tests_report`` + ``get_resolution_status`` decide: an instance is resolved
(``RESOLVED_FULL``) when every ``FAIL_TO_PASS`` test passes and no ``PASS_TO_PASS`` test fails.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import Any

from dressage.errors import ConfigError
from recipes.extras import require
from recipes.swe.records import SweRecord, patch_paths

DEFAULT_TEST_CMD = "python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider"
"""pytest with SWE-bench's ``-rA`` report (one ``PASSED``/``FAILED`` line per test) for the
``parse_log_pytest`` parser; ``python3 -m`` puts the repository root on ``sys.path``."""

DEFAULT_LOG_PARSER = "parse_log_pytest"
HEREDOC = "EOF_114329324912"
"""The heredoc delimiter SWE-bench's eval scripts use for the test patch."""


def eval_script(record: SweRecord, test_cmd: str) -> str:
    """An eval script in SWE-bench's shape for a record without one (module docstring)."""
    files = patch_paths(record.test_patch)
    quoted = " ".join(shlex.quote(f) for f in files)
    if HEREDOC in record.test_patch:
        raise ConfigError(f"instance {record.instance_id}: test_patch contains the heredoc marker {HEREDOC}")
    reset = f"git checkout {record.base_commit} -- {quoted}"
    tests = " ".join(shlex.quote(f) for f in files if f.endswith(".py")) or quoted
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            reset,
            f"git apply -v - <<'{HEREDOC}'",
            record.test_patch.rstrip("\n"),
            HEREDOC,
            ": '>>>>> Start Test Output'",
            f"{record.test_cmd or test_cmd} {tests}",
            ": '>>>>> End Test Output'",
            reset,
        ]
    )


def swebench_instance(record: SweRecord, test_cmd: str, log_parser: str) -> dict[str, Any]:
    """``record`` as the instance dict SWE-bench 5's ``make_test_spec`` reads."""
    parser = record.log_parser or log_parser
    registry = require("swebench.harness.log_parsers", "swe").PARSER_REGISTRY
    if parser not in registry:
        raise ConfigError(
            f"instance {record.instance_id}: log_parser {parser!r} is not one of SWE-bench's parsers"
        )
    return {
        "instance_id": record.instance_id,
        "image": record.image or "",
        "repo": record.repo,
        "version": record.version or "",
        "FAIL_TO_PASS": record.FAIL_TO_PASS,
        "PASS_TO_PASS": record.PASS_TO_PASS,
        "log_parser": parser,
        "eval_type": record.eval_type or "pass_and_fail",
        "eval_script": record.eval_script or eval_script(record, test_cmd),
    }


def test_spec(
    record: SweRecord, test_cmd: str = DEFAULT_TEST_CMD, log_parser: str = DEFAULT_LOG_PARSER
) -> Any:
    """SWE-bench's ``TestSpec`` of ``record`` (its ``eval_script`` property is what the sandbox runs)."""
    make = require("swebench.harness.utils", "swe").make_test_spec
    return make(swebench_instance(record, test_cmd, log_parser))


def grade_log(spec: Any, log: str) -> dict[str, Any]:
    """SWE-bench's verdict on an eval log: ``resolved``, ``status`` (``RESOLVED_FULL``/..., or
    ``TESTS_DID_NOT_RUN`` when the log holds no usable result) and the per-test ``report``."""
    grading = require("swebench.harness.grading", "swe")
    constants = require("swebench.harness.constants", "swe")
    with tempfile.TemporaryDirectory() as d:
        log_fp = Path(d) / "test_output.txt"
        log_fp.write_text(log, encoding="utf-8")
        status_map, found = grading.get_logs_eval(spec, str(log_fp))
    if not found:
        return {"resolved": False, "status": "TESTS_DID_NOT_RUN", "report": {}}
    gold = {constants.FAIL_TO_PASS: spec.FAIL_TO_PASS, constants.PASS_TO_PASS: spec.PASS_TO_PASS}
    report = grading.get_eval_tests_report(status_map, gold, eval_type=constants.EvalType(spec.eval_type))
    status = grading.get_resolution_status(report)
    return {
        "resolved": status == constants.ResolvedStatus.FULL.value,
        "status": status,
        "report": {k: v for k, v in report.items() if k in gold},
    }
