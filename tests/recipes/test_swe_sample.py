"""The shipped SWE sample is reproducible (slow tier): building the four repositories from
``recipes/swe/sample/`` and validating them by running their tests, as SWE-bench's validation does,
gives the committed records byte for byte (same commit ids, patches, FAIL_TO_PASS / PASS_TO_PASS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("swebench", "the SWE recipe needs the 'swe' extra")

from recipes.swe.make_sample import DATA, RECORDS, main, make_sample  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_fresh_build_gives_the_committed_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = make_sample(tmp_path)
    assert built.read_text() == (DATA / RECORDS).read_text()
    assert sorted(p.name for p in (tmp_path / "repos").iterdir()) == [
        "acme__csvlite",
        "acme__intervalkit",
        "acme__slugkit",
        "acme__versioncmp",
    ]
    assert main(["--out", str(tmp_path), "--repos-only"]) == 0
    (tmp_path / RECORDS).write_text((DATA / RECORDS).read_text().replace("csvlite", "csvlight", 1))
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert "error: a fresh build differs from" in capsys.readouterr().out
