"""The TextWorld recipe's parts without an engine (slow tier: TextWorld's generator compiles each game
with Inform 7, seconds per game): games generated from the shipped specs are the same for the same
seed, the loader reads them and a folder of game files, the walkthrough wins (reward 1) and a wrong
command list scores 0 when the reward replays it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from dressage.agents.base import AgentResult, Task
from dressage.errors import ConfigError
from dressage.rollout.config import load_config
from dressage.rollout.datasets import load_tasks
from dressage.rollout.rewards import RewardInput
from tests.conftest import require_module

require_module("textworld", "the TextWorld recipe needs the 'textworld' extra")

from recipes.textworld.games import GameSpec, Level, make_game, read_game  # noqa: E402
from recipes.textworld.loader import game_file_of  # noqa: E402
from recipes.textworld.play import replay  # noqa: E402
from recipes.textworld.reward import score  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GAMES = REPO / "recipes" / "textworld" / "data" / "games.yaml"
LOADER = "recipes.textworld.loader:load_tasks"
EASY_11 = ["unlock locker with latchkey", "open locker"]
"""The walkthrough of the two-room game of seed 11 (tw-make custom --world-size 2 --nb-objects 4
--quest-length 2 --seed 11 makes the same game)."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("textworld-cache")


@pytest.fixture()
def tasks(cache: Path, monkeypatch: pytest.MonkeyPatch) -> list[Task]:
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(cache))
    return load_tasks(GAMES, loader=LOADER)


def test_the_loader_generates_the_shipped_specs_and_reads_their_games(tasks: list[Task], cache: Path) -> None:
    assert [t.metadata["textworld"]["spec"]["level"] for t in tasks] == ["easy", "easy", "medium", "hard"]
    meta = tasks[0].metadata["textworld"]
    assert meta["walkthrough"] == EASY_11 and meta["max_score"] == 1.0
    assert meta["game_file"] is None  # no machine-local path in the payload: the spec finds the game
    assert game_file_of(meta).is_relative_to(cache / "textworld") and game_file_of(meta).is_file()
    assert "locker" in (tasks[0].prompt or "") and tasks[0].id and tasks[0].id.startswith("easy-s11-")
    lengths = [len(t.metadata["textworld"]["walkthrough"]) for t in tasks]
    assert lengths[0] == 2 and lengths[-1] > lengths[0]  # harder levels, longer quests


def test_a_folder_of_game_files_is_a_dataset(tasks: list[Task], tmp_path: Path) -> None:
    for t in tasks[:2]:
        src = game_file_of(t.metadata["textworld"])
        for suffix in (".z8", ".json"):
            shutil.copy(src.with_suffix(suffix), tmp_path / f"{t.id}{suffix}")
    read = load_tasks(tmp_path, loader=LOADER)
    assert [t.metadata["textworld"]["walkthrough"] for t in read] == [
        t.metadata["textworld"]["walkthrough"] for t in tasks[:2]
    ]
    assert read[0].metadata["textworld"]["spec"] is None
    assert read[0].metadata["textworld"]["game_file"] == str(tmp_path / f"{tasks[0].id}.z8")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no TextWorld game files"):
        load_tasks(tmp_path / "empty", loader=LOADER)


def test_the_same_seed_makes_the_same_game_and_a_lost_file_is_regenerated(
    tasks: list[Task], tmp_path: Path
) -> None:
    spec = GameSpec.model_validate(tasks[2].metadata["textworld"]["spec"])
    again = read_game(make_game(spec, cache=tmp_path))
    assert again.walkthrough == tasks[2].metadata["textworld"]["walkthrough"]
    moved = {**tasks[0].metadata["textworld"], "game_file": str(tmp_path / "gone" / "game.z8")}
    assert read_game(game_file_of(moved)).walkthrough == EASY_11
    other = GameSpec(level="easy", options=Level(nb_rooms=2, nb_objects=4, quest_length=2), seed=12)
    assert other.name != GameSpec.model_validate(tasks[0].metadata["textworld"]["spec"]).name


def _reward(task: Task, commands: list[str], metric: str = "score") -> float:
    result = AgentResult(answer="", info={"commands": commands})
    inp = RewardInput(task=task, answer="", result=result, sandbox=None)  # type: ignore[arg-type]
    return asyncio.run(score(inp, metric=metric)).reward


def test_the_walkthrough_wins_and_a_wrong_play_scores_0(tasks: list[Task]) -> None:
    for task in tasks:
        walkthrough = task.metadata["textworld"]["walkthrough"]
        out = replay(game_file_of(task.metadata["textworld"]), walkthrough)
        assert out.won and out.score == out.max_score
        assert _reward(task, walkthrough) == 1.0 and _reward(task, walkthrough, "win") == 1.0
        assert _reward(task, ["look"] * len(walkthrough)) == 0.0
    assert _reward(tasks[0], EASY_11[:1]) == 0.0  # half the quest: no point yet, no win


@pytest.mark.parametrize("name", ["config", "oracle", "gpu"])
def test_the_configs_load_and_name_the_recipe_code(name: str) -> None:
    cfg = load_config(REPO / "recipes" / "textworld" / f"{name}.yaml")
    assert cfg.dataset.loader == LOADER and Path(cfg.dataset.path) == GAMES
