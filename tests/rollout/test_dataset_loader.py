"""``dataset.loader``: a dotted-path reader of any dataset format, its tasks checked as a JSONL file's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dressage.errors import ConfigError
from dressage.rollout.config import parse_config
from dressage.rollout.datasets import load_tasks

M = "tests.rollout.dataset_loaders"


def test_a_loader_reads_the_file_and_limit_applies(tmp_path: Path) -> None:
    path = tmp_path / "words.txt"
    path.write_text("alpha beta gamma", encoding="utf-8")
    tasks = load_tasks(path, loader=f"{M}:lines")
    assert [(t.index, t.prompt, t.label) for t in tasks] == [
        (0, "alpha", "ALPHA"),
        (1, "beta", "BETA"),
        (2, "gamma", "GAMMA"),
    ]
    assert len(load_tasks(path, limit=2, loader=f"{M}:lines")) == 2


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("not_a_list", "must return a list of Task, got dict"),
        ("misnumbered", "task 0 has index 1; number them from 0"),
        ("nothing", "has no tasks (read by tests.rollout.dataset_loaders:nothing)"),
        ("unstorable", "task t0: prompt: contains a NUL character"),
        ("refuses", "record 3: question: missing"),
        ("NOT_CALLABLE", "is not callable"),
        ("absent", "has no attribute 'absent'"),
    ],
)
def test_a_bad_loader_or_its_tasks_are_refused_in_one_line(tmp_path: Path, fn: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_tasks(tmp_path / "x", loader=f"{M}:{fn}")


def test_the_config_takes_a_dotted_path_and_resolves_the_file(tmp_path: Path) -> None:
    cfg = parse_config({"run": "r", "dataset": {"path": "d.txt", "loader": f"{M}:lines"}}, base_dir=tmp_path)
    assert cfg.dataset.loader == f"{M}:lines" and cfg.dataset.path == str(tmp_path / "d.txt")
    with pytest.raises(ConfigError, match=r"dataset\.loader: .*is not a dotted path like"):
        parse_config({"run": "r", "dataset": {"path": "d.txt", "loader": "no path"}})
