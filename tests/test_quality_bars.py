"""The code-quality bars of the issue tracker, measured by scripts/quality_bars.py (which prints them).

- no function over 80 lines outside tests;
- ``Any`` per 1,000 lines does not grow (the target is under 12; the ceiling is lowered as it falls);
- a blind ``except Exception`` either re-raises (a third-party error translated at its seam) or sits
  at a process or request boundary listed in :data:`BOUNDARIES`, and every one is logged or reported.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _bars() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quality_bars", ROOT / "scripts" / "quality_bars.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quality_bars"] = module
    spec.loader.exec_module(module)
    return module


bars = _bars()

ANY_PER_1000_CEILING = 12.0
"""Lower it as ``Any`` gives way to typed models; the target is 12."""

BOUNDARIES: dict[tuple[str, str], str] = {
    ("dressage/cleanup.py", "logged_failures"): "a shutdown step must not mask the real error; logged",
    (
        "dressage/cli/store_commands.py",
        "_decoder",
    ): "show --tokens: no tokenizer falls back to ids, with a note",
    ("dressage/engines/dev_runtime.py", "_run"): "the engine thread hands any failure to the caller's future",
    (
        "dressage/engines/dev_runtime.py",
        "_step_guarded",
    ): "one request fails (500), the engine serves on; logged",
    (
        "dressage/store/pg_group_append.py",
        "_write",
    ): "a group's unexpected failure goes to each waiting caller's future; logged",
    ("dressage/proxy/recording.py", "_parse_safely"): "a reply the parser cannot read is recorded as text",
    ("dressage/proxy/turns.py", "_stream"): "a stream's failure becomes the stream's error event",
    (
        "dressage/rollout/engine_health.py",
        "_probe_forever",
    ): "a failed probe round must never stop engine supervision; logged",
}

NOT_LOGGED_BEING_FIXED: set[tuple[str, str]] = set()
"""Silent blind excepts in code another refactor owns; the lead empties this after merging."""


def test_no_function_is_over_80_lines() -> None:
    over = sorted(
        f"{f.path}:{f.name} ({f.lines} lines)" for f in bars.functions() if f.lines > bars.MAX_FUNCTION_LINES
    )
    assert not over, "functions over 80 lines: " + ", ".join(over)


def test_any_per_1000_lines_does_not_grow() -> None:
    uses, lines = bars.any_per_1000()
    assert 1000 * uses / lines <= ANY_PER_1000_CEILING, f"{uses} Any in {lines} lines"


def test_blind_excepts_re_raise_or_are_listed_boundaries() -> None:
    blind = bars.blind_excepts()
    swallowing = {(b.path, b.function) for b in blind if not b.raises}
    unlisted = sorted(swallowing - BOUNDARIES.keys())
    assert not unlisted, f"blind excepts that swallow the error outside a listed boundary: {unlisted}"
    stale = sorted(BOUNDARIES.keys() - swallowing)
    assert not stale, f"remove these from BOUNDARIES, they no longer catch everything: {stale}"


def test_every_blind_except_is_logged() -> None:
    silent = sorted(
        {(b.path, b.function) for b in bars.blind_excepts() if not b.logged} - NOT_LOGGED_BEING_FIXED
    )
    assert not silent, f"blind excepts that neither log, report nor re-raise: {silent}"
