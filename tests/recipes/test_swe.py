"""The SWE recipe's default-tier tests: the loader reads SWE-bench's public record format from the
shipped sample (JSON Lines, JSON, Parquet), a bad record is named, and the integrity rules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import require_module

require_module("swebench", "the SWE recipe needs the 'swe' extra")

from dressage.errors import ConfigError  # noqa: E402
from dressage.rollout import task_kinds  # noqa: E402
from dressage.rollout.config import load_config  # noqa: E402
from recipes.swe.checkout import repo_source  # noqa: E402
from recipes.swe.integrity import parse_name_status, violations  # noqa: E402
from recipes.swe.loader import KIND, load_tasks, record_of  # noqa: E402
from recipes.swe.make_sample import DATA, RECORDS  # noqa: E402
from recipes.swe.records import read_records  # noqa: E402
from tests.recipes.swe_fixtures import swe_data  # noqa: E402

SHIPPED = DATA / RECORDS


def test_the_shipped_sample_is_swe_bench_records() -> None:
    raw = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    assert len(raw) == 4 and all(
        isinstance(r["FAIL_TO_PASS"], str) for r in raw
    )  # JSON strings, as on the Hub
    records = read_records(SHIPPED)
    assert [r.instance_id for r in records] == [
        "acme__csvlite-4",
        "acme__intervalkit-12",
        "acme__slugkit-31",
        "acme__versioncmp-7",
    ]
    for r in records:
        assert r.FAIL_TO_PASS and r.PASS_TO_PASS and len(r.base_commit) == 40
        assert "tests/" in r.test_patch and "tests/" not in r.patch


def test_json_and_parquet_files_and_list_fields_read_the_same(tmp_path: Path) -> None:
    raw = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    as_lists = [{**r, "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"])} for r in raw]
    (tmp_path / "a.json").write_text(json.dumps(as_lists))
    pq.write_table(pa.Table.from_pylist(raw), tmp_path / "a.parquet")
    expected = read_records(SHIPPED)
    assert read_records(tmp_path / "a.json") == expected
    assert read_records(tmp_path / "a.parquet", limit=2) == expected[:2]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"base_commit": None}, "line 1: base_commit: Field required"),
        ({"FAIL_TO_PASS": "[oops"}, "line 1: FAIL_TO_PASS: not a JSON list of test names"),
        ({"FAIL_TO_PASS": "[]"}, "line 1: FAIL_TO_PASS: must name at least one test"),
        ({"tests_pass": []}, "line 1: tests_pass: Extra inputs are not permitted"),
    ],
)
def test_a_bad_record_is_named(tmp_path: Path, change: dict, message: str) -> None:
    raw = json.loads(SHIPPED.read_text().splitlines()[0])
    raw.update(change)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({k: v for k, v in raw.items() if v is not None}) + "\n")
    with pytest.raises(ConfigError) as e:
        read_records(bad)
    assert message in str(e.value)


def test_the_loader_checks_out_each_repository_at_its_base_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = swe_data(tmp_path, monkeypatch)
    tasks = load_tasks(records, None)
    assert [t.kind for t in tasks] == [KIND] * 4 and [t.index for t in tasks] == [0, 1, 2, 3]
    task = tasks[1]
    assert task.id == "acme__intervalkit-12" and "merge() leaves touching intervals separate" in (
        task.prompt or ""
    )
    assert task.metadata[KIND]["source"] == str(records.parent / "repos" / "acme__intervalkit")
    assert record_of(task).base_commit == read_records(records)[1].base_commit
    assert task_kinds.kind_of(task) is not None  # importing the loader registered the kind
    (checkout,) = (tmp_path / "cache" / "swe-checkouts").glob("acme__intervalkit-12-*")
    assert "start < result[-1][1]" in (checkout / "intervalkit" / "core.py").read_text()  # the bug
    log = subprocess.run(["git", "log", "--all", "--format=%s"], cwd=checkout, capture_output=True, text=True)
    assert log.stdout.split("\n")[0] == "Initial version" and "Fix #12" not in log.stdout  # no later history


def test_a_missing_repository_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    raw = json.loads(SHIPPED.read_text().splitlines()[0])
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({**raw, "repo_url": "no-such-repo"}) + "\n")
    assert repo_source(read_records(records)[0], tmp_path) == str(tmp_path / "no-such-repo")
    with pytest.raises(ConfigError, match=r"instance acme__csvlite-4: the checkout of .*no-such-repo at"):
        load_tasks(records, None)


def test_integrity_rules() -> None:
    record = read_records(SHIPPED)[1]  # intervalkit; test_patch touches tests/test_core.py
    changes = parse_name_status("M\0intervalkit/core.py\0A\0tests/test_new.py\0")
    assert changes == [("M", "intervalkit/core.py"), ("A", "tests/test_new.py")]
    assert violations(changes, record) == []  # the fix, and a new test of the agent's own
    assert violations([("M", "tests/test_core.py")], record) == [
        "M tests/test_core.py: a file of the test patch"
    ]
    assert violations([("D", "tests/helpers.py")], record) == ["D tests/helpers.py: an existing test file"]
    assert violations([("A", "src/conftest.py"), ("M", "setup.cfg")], record) == [
        "A src/conftest.py: a file that controls how the tests run",
        "M setup.cfg: a file that controls how the tests run",
    ]


def test_a_missing_extra_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "swebench", None)  # what import sees when the package is absent
    with pytest.raises(ConfigError) as e:
        load_tasks(SHIPPED, None)
    assert str(e.value) == "this recipe needs 'swebench', from the 'swe' extra: pip install -e '.[swe]'"


@pytest.mark.parametrize(
    ("name", "agent"), [("config", "python"), ("oracle", "python"), ("cli", "opencode"), ("gpu", "python")]
)
def test_the_configs_load_and_name_the_recipe_code(name: str, agent: str) -> None:
    cfg = load_config(DATA.parent / f"{name}.yaml")
    assert cfg.dataset.loader == "recipes.swe.loader:load_tasks" and Path(cfg.dataset.path) == SHIPPED
    assert cfg.agent.kind == agent and cfg.reward.kind == "python"
