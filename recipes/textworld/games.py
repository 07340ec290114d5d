"""TextWorld games: generated from a level and a seed with TextWorld's own generator, and read from
TextWorld's game files.

A game spec (:class:`GameSpec`) is a difficulty level (``nb_rooms``, ``nb_objects``,
``quest_length``: ``tw-make custom``'s options) and a seed; :func:`make_game` generates and compiles it
(``textworld.make``, what ``tw-make custom`` runs: generation, then Inform 7 to a Z-machine ``.z8``) into the cache,
once: a game is keyed by its spec and TextWorld's version, written to a temporary folder and renamed,
so concurrent workers never see half a game. TextWorld's game files (``NAME.z8`` beside its
``NAME.json``: the format ``tw-make`` writes and TextWorld's published game sets use) are read by
:func:`read_game`: the objective, the walkthrough and the maximum score.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dressage.tito._cache import cache_subdir
from recipes.extras import require


class Level(BaseModel):
    """A difficulty level: tw-make custom's world size, object count and quest length."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    nb_rooms: int = Field(ge=1, le=50)
    nb_objects: int = Field(ge=0, le=100)
    quest_length: int = Field(ge=1, le=50)


class GameSpec(BaseModel):
    """One game to generate: its level's options and a seed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    level: str
    options: Level
    seed: int = Field(ge=0)

    @property
    def name(self) -> str:
        """``LEVEL-sSEED-HASH``: readable, and distinct per options and TextWorld version."""
        textworld = require("textworld", "textworld")
        payload = json.dumps([self.options.model_dump(), self.seed, textworld.__version__], sort_keys=True)
        return f"{self.level}-s{self.seed}-{hashlib.sha256(payload.encode()).hexdigest()[:10]}"


class GameInfo(BaseModel):
    """What a task needs of a game file: where it is, its objective, walkthrough and maximum score."""

    game_file: str
    objective: str
    walkthrough: list[str]
    max_score: float


def make_game(spec: GameSpec, cache: Path | None = None) -> Path:
    """The ``.z8`` file of ``spec``, generated and compiled into the cache unless already there."""
    textworld = require("textworld", "textworld")
    root = cache or cache_subdir("textworld")
    final = root / spec.name / "game.z8"
    if final.is_file() and final.with_suffix(".json").is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=root))
    try:
        options = textworld.GameOptions()
        options.seeds = spec.seed
        options.nb_rooms = spec.options.nb_rooms
        options.nb_objects = spec.options.nb_objects
        options.quest_length = spec.options.quest_length
        options.path = str(tmp / "game.z8")
        options.force_recompile = True
        textworld.make(options)  # what `tw-make custom` calls: generate, then compile with Inform 7
        try:
            os.replace(tmp, final.parent)
        except OSError:
            if not final.is_file():  # another worker won the race only if its game is complete
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def read_game(game_file: Path) -> GameInfo:
    """The objective, walkthrough and maximum score of a TextWorld game file (its ``.json`` sidecar)."""
    textworld = require("textworld", "textworld")
    sidecar = game_file.with_suffix(".json")
    game: Any = textworld.Game.load(str(sidecar))
    if not game.walkthrough:
        raise ValueError(f"{sidecar} has no walkthrough (a TextWorld game made with quests has one)")
    return GameInfo(
        game_file=str(game_file.resolve()),
        objective=str(game.objective),
        walkthrough=[str(c) for c in game.walkthrough],
        max_score=float(game.max_score),
    )
