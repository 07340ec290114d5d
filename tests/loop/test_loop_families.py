"""``dressage-worker loop`` on every model family's tiny random model, with its profile recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dressage.store import EventStore
from dressage.tito.profiles import RUN_RECORD_KEY, get_profile
from tests.loop.test_loop import drive, write_config
from tests.tito.references import deepseek_reference, mistral_reference, qwen36_reference

REFERENCES = {
    "qwen3.6": qwen36_reference(False),
    "deepseek-v3": deepseek_reference,
    "mistral-nemo": mistral_reference,
}
PROMPTS = ("Say a word with the letter e.", "Say a word with the letter a.")

FAMILIES = {
    "qwen3.6": ("tiny-qwen3.6", False),
    "deepseek-v3": ("tiny-deepseek-v3", None),
    "mistral-nemo": ("tiny-mistral-nemo", None),
}


@pytest.mark.parametrize("profile", sorted(FAMILIES))
def test_loop_runs_on_the_family(tmp_path: Path, profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, thinking = FAMILIES[profile]
    path = write_config(tmp_path, "sync")
    cfg = yaml.safe_load(path.read_text())
    cfg["model_profile"] = profile
    cfg["engine"]["model"] = model
    cfg["sampling"]["enable_thinking"] = thinking
    cfg["loop"]["iterations"] = 1
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr("tests.loop.test_loop.write_config", lambda *a, **k: path)
    loop, _, settings = drive(tmp_path, "sync")
    assert loop.stats and loop.stats[0].finished == 4
    store = EventStore.open(settings=settings)
    try:
        run = store.runs.get(loop.run_name)
        recorded = run.config[RUN_RECORD_KEY]
        assert recorded == {"model_profile": profile, "template_sha256": get_profile(profile).template_hash}
        turns = store.turns.read(run=loop.run_name, with_experts=False)
        assert len(turns) == 4 and all(t.route == "create" for t in turns)
        # what the proxy recorded equals the independent reference (official rendering + shipped vocabulary)
        want = [REFERENCES[profile]([{"role": "user", "content": p}], None, thinking) for p in PROMPTS]
        assert all([int(i) for i in t.context_ids] in want for t in turns)
    finally:
        store.close()
