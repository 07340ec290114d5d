"""The viewer decodes a run's tokens with the vocabulary of the model profile the run recorded."""

from __future__ import annotations

from pathlib import Path

from dressage.config import Settings
from dressage.store import EventStore
from dressage.tito.profiles import get_profile, profile_record
from dressage.view.decode import TokenDecoder
from dressage.view.pages import Viewer


def test_decoder_follows_the_recorded_profile(tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path))
    try:
        mistral = store.runs.create("m", {"tito": profile_record(get_profile("mistral-nemo"))})
        qwen = store.runs.create("q", {"tito": profile_record(get_profile("qwen3.5"))})
        bare = store.runs.create("b", {})
        default = TokenDecoder(None)
        viewer = Viewer(store, default)
        assert viewer.decoder_for(mistral).text([1, 3, 8101, 4]) == "<s>[INST]hi[/INST]"
        assert viewer.decoder_for(qwen) is default and viewer.decoder_for(bare) is default
    finally:
        store.close()
