"""TextWorld games read into tasks: the ``dataset.loader`` of this recipe.

``dataset.path`` is either a folder of TextWorld game files (``*.z8`` / ``*.ulx`` each beside its
``.json``: what ``tw-make`` writes and TextWorld's published sets ship) or a YAML file of game specs
(``data/games.yaml``: difficulty levels and seeds), whose games are generated locally by TextWorld's
own generator first (:func:`recipes.textworld.games.make_game`, cached). A task's prompt is the
game's objective; ``metadata.textworld`` keeps the walkthrough (the oracle), the maximum score, and
where the game is: a generated game by its spec alone (each machine finds it in its own cache, or
regenerates it: same seed, same game), so no machine-local path enters the task payload and workers
on several machines share the run's dataset digest; a game file read from a folder by its path
(resolved against the config file, as ``dataset.path`` itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from dressage.agents.base import Task
from dressage.errors import ConfigError
from recipes.textworld.games import GameInfo, GameSpec, Level, make_game, read_game

PROMPT = (
    "You are playing a text adventure game. Send one command at a time with the act tool (for example "
    "'look', 'inventory', 'go east', 'open box', 'take key', 'unlock door with key'); each call returns "
    "what happens. The game ends when you reach the goal.\n\nGoal: {objective}"
)
GAME_SUFFIXES = (".z8", ".ulx")


class GamesFile(BaseModel):
    """``data/games.yaml``: the levels and the games (a level and a seed each)."""

    model_config = ConfigDict(extra="forbid")
    levels: dict[str, Level]
    games: list[dict[str, Any]]

    def specs(self) -> list[GameSpec]:
        """The games as specs; an unknown level names itself."""
        out = []
        for i, g in enumerate(self.games):
            level = g.get("level")
            if level not in self.levels:
                raise ValueError(f"games[{i}].level {level!r} is not one of {sorted(self.levels)}")
            extra = set(g) - {"level", "seed"}
            if extra:
                raise ValueError(f"games[{i}]: unknown keys {sorted(extra)} (give level and seed)")
            out.append(GameSpec(level=str(level), options=self.levels[str(level)], seed=int(g["seed"])))
        return out


def read_specs(path: Path) -> list[GameSpec]:
    """The game specs of a games YAML file; errors name the file and the field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return GamesFile.model_validate(data).specs()
    except FileNotFoundError:
        raise ConfigError(
            f"dataset {path} does not exist (dataset.path is relative to the config file)"
        ) from None
    except (yaml.YAMLError, ValidationError, ValueError, TypeError, KeyError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{path}: {first}") from None


def _task(index: int, info: GameInfo, spec: GameSpec | None) -> Task:
    meta: dict[str, Any] = {**info.model_dump(), "spec": spec.model_dump() if spec else None}
    if spec is not None:
        meta["game_file"] = None  # found by its spec in each machine's cache (game_file_of)
    return Task(
        index=index,
        id=Path(info.game_file).parent.name if spec else Path(info.game_file).stem,
        prompt=PROMPT.format(objective=info.objective),
        metadata={"textworld": meta},
    )


def load_tasks(path: Path, limit: int | None = None) -> list[Task]:
    """The tasks of a games folder or a games YAML file (the config's ``dataset.loader``)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in GAME_SUFFIXES)
        if not files:
            raise ConfigError(
                f"dataset {path} holds no TextWorld game files (*.z8 or *.ulx with a .json beside)"
            )
        games: list[tuple[Path, GameSpec | None]] = [(f, None) for f in files]
    else:
        games = [(Path(), s) for s in read_specs(path)]
    games = games[:limit] if limit is not None else games
    tasks = []
    for i, (file, spec) in enumerate(games):
        game_file = make_game(spec) if spec is not None else file
        try:
            info = read_game(game_file)
        except (OSError, ValueError) as e:
            raise ConfigError(f"TextWorld game {game_file}: {e}") from None
        tasks.append(_task(i, info, spec))
    return tasks


def game_file_of(meta: dict[str, Any]) -> Path:
    """The task's game file: a generated game's from this machine's cache (generated when absent:
    same seed, same game), a folder's game by its recorded path."""
    if meta.get("spec") is not None:
        return make_game(GameSpec.model_validate(meta["spec"]))
    path = Path(meta["game_file"])
    if not path.is_file():
        raise FileNotFoundError(f"the TextWorld game {path} is gone (a game read from a folder has no spec)")
    return path
