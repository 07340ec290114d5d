"""The HotpotQA recipe's parts without an engine: the loader on the shipped sample (the official
format and the Hugging Face form), the official EM / F1 reward, the bm25s search and open tools, and
the configs. The runs (oracle 1 and wrong 0 through a real rollout, the loop) are in
tests/recipes/test_recipe_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dressage.agents.base import AgentResult, Task
from dressage.errors import ConfigError
from dressage.rollout.config import load_config
from dressage.rollout.datasets import load_tasks
from dressage.rollout.rewards import RewardInput
from tests.conftest import require_module

require_module("bm25s", "the HotpotQA recipe needs the 'hotpotqa' extra")

from recipes.hotpotqa.loader import read_records  # noqa: E402
from recipes.hotpotqa.reward import exact_match_score, f1_score, normalize_answer, score  # noqa: E402
from recipes.hotpotqa.search import SearchIndex, index_for, pages_of  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "recipes" / "hotpotqa" / "data" / "hotpot_sample.json"
LOADER = "recipes.hotpotqa.loader:load_tasks"


def test_the_loader_reads_the_official_format_from_the_shipped_sample() -> None:
    raw = json.loads(SAMPLE.read_text(encoding="utf-8"))
    tasks = load_tasks(SAMPLE, loader=LOADER)
    assert [t.index for t in tasks] == list(range(len(raw))) and len(tasks) == 6
    first, record = tasks[0], raw[0]
    assert first.id == record["_id"] and first.label == record["answer"]
    assert record["question"] in (first.prompt or "")
    meta = first.metadata["hotpotqa"]
    assert meta["supporting_facts"] == record["supporting_facts"]
    assert meta["context"] == record["context"] and meta["corpus_file"] == str(SAMPLE.resolve())
    assert {t.metadata["hotpotqa"]["type"] for t in tasks} == {"bridge", "comparison"}
    assert len(load_tasks(SAMPLE, limit=2, loader=LOADER)) == 2


def test_the_loader_reads_jsonl_in_the_hugging_face_form(tmp_path: Path) -> None:
    rec = json.loads(SAMPLE.read_text(encoding="utf-8"))[1]
    hf = {
        **{k: v for k, v in rec.items() if k != "_id"},
        "id": rec["_id"],
        "context": {"title": [p[0] for p in rec["context"]], "sentences": [p[1] for p in rec["context"]]},
        "supporting_facts": {
            "title": [f[0] for f in rec["supporting_facts"]],
            "sent_id": [f[1] for f in rec["supporting_facts"]],
        },
    }
    path = tmp_path / "hf.jsonl"
    path.write_text(json.dumps(hf) + "\n", encoding="utf-8")
    [task] = load_tasks(path, loader=LOADER)
    assert task.id == rec["_id"]
    assert task.metadata["hotpotqa"]["context"] == rec["context"]
    assert task.metadata["hotpotqa"]["supporting_facts"] == rec["supporting_facts"]


def test_a_bad_record_names_the_file_record_and_field(tmp_path: Path) -> None:
    rec = json.loads(SAMPLE.read_text(encoding="utf-8"))[0]
    del rec["answer"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([rec]), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.json record 0: answer: Field required"):
        read_records(path)
    path.write_text(json.dumps([{**rec, "answer": "x", "anwser": "y"}]), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.json record 0: anwser: Extra inputs are not permitted"):
        read_records(path)


def test_the_official_normalisation_and_metrics() -> None:
    assert normalize_answer("The  Danube!") == "danube"
    assert exact_match_score("the Danube.", "Danube") == 1.0
    assert f1_score("Philip Dick", "Philip K. Dick") == pytest.approx(0.8)
    assert f1_score("no", "yes") == 0.0 and f1_score("yes it is", "yes") == 0.0
    assert exact_match_score("Rhine", "the Danube") == 0.0


def _inp(task: Task, answer: str) -> RewardInput:
    return RewardInput(task=task, answer=answer, result=AgentResult(answer=answer), sandbox=None)  # type: ignore[arg-type]


def test_the_gold_answer_scores_1_and_a_wrong_one_0_with_either_metric() -> None:
    tasks = load_tasks(SAMPLE, loader=LOADER)
    for task in tasks:
        for metric in ("em", "f1"):
            assert score(_inp(task, f"Let me think.\n{task.label}"), metric=metric).reward == 1.0
            assert score(_inp(task, "unknown"), metric=metric).reward == 0.0
    partial = score(_inp(tasks[2], "Philip Dick"), metric="f1")
    assert 0 < partial.reward < 1 and partial.details["em"] == 0.0


def test_search_finds_the_supporting_paragraphs_and_open_reads_them() -> None:
    [task] = load_tasks(SAMPLE, limit=1, loader=LOADER)
    index = index_for(task.metadata["hotpotqa"], "dataset", top_k=3)
    assert len(index.pages) == 24  # every record's paragraphs, each title once
    found = index.call("search", json.dumps({"query": "composer of The Planets suite"}))
    assert found.splitlines()[1].startswith("1. The Planets: The Planets is a seven-movement")
    page = index.call("open", json.dumps({"title": "Gustav Holst"}))
    assert "[1] He was born in 1874 in Cheltenham" in page
    assert "No page titled 'Nowhere'" in index.open("Nowhere")
    assert index.call("search", "{not json").startswith("error: the arguments are not JSON")
    own = index_for(task.metadata["hotpotqa"], "question", top_k=2)
    assert len(own.pages) == 4 and own.search("the of")  # stopwords only: answered, not raised


def test_a_title_seen_twice_keeps_its_first_paragraph() -> None:
    pages = pages_of([["A", ["one."]], ["B", ["two."]], ["A", ["other."]]])
    assert [(p.title, p.sentences) for p in pages] == [("A", ("one.",)), ("B", ("two.",))]
    assert SearchIndex(pages).open("A") == "A\n[0] one."


@pytest.mark.parametrize("name", ["config", "oracle", "gpu"])
def test_the_configs_load_and_name_the_recipe_code(name: str) -> None:
    cfg = load_config(REPO / "recipes" / "hotpotqa" / f"{name}.yaml")
    assert cfg.dataset.loader == LOADER and Path(cfg.dataset.path) == SAMPLE
    assert cfg.agent.kind == "python" and cfg.reward.kind == "python"
