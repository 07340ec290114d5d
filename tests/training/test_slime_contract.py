"""slime's own rollout-plugin contract, run unmodified against ``generate_rollout`` on a real log.

slime cannot be installed here, so this runs only when ``DRESSAGE_SLIME_SOURCE`` points at a
THUDM/slime checkout (the pinned commit, ``dressage.training.samples.SLIME_COMMIT``) whose modules
import with this interpreter (slime's contract stubs ray, sglang_router and transformers itself;
its rollout module also needs ``aiohttp`` and ``pylatexenc``: put them on ``PYTHONPATH`` or install
them). Otherwise it skips and says which of those is missing.

The log is a real one: ``dressage-worker rollout`` with the CPU dev engine, 3 tasks x 2 samples
(slime's contract expects groups of 2) and an ``eval:`` round of 2 tasks. slime's contract calls
``fn(None, 2, data_source)`` (a fresh consumer starting at rollout 2) and then ``evaluation=True``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dressage.config import Settings
from dressage.store import EventStore
from dressage.training.samples import SLIME_COMMIT

REPO = Path(__file__).resolve().parents[2]
CONTRACT = Path("tests/plugin_contracts/test_plugin_rollout_contracts.py")
PLUGIN = "dressage.integrations.slime.generate_rollout"


def slime_env(source: Path, **extra: str) -> dict[str, str]:
    """This interpreter's environment with slime's source and the repo first on ``PYTHONPATH``."""
    paths = [str(source), str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def slime_source_or_skip() -> Path:
    """The checkout named by ``DRESSAGE_SLIME_SOURCE``, or a skip saying what is missing."""
    source = Settings().slime_source
    if source is None:
        pytest.skip(f"DRESSAGE_SLIME_SOURCE is not set (a THUDM/slime checkout at {SLIME_COMMIT[:9]})")
    if not (source / CONTRACT).is_file():
        pytest.skip(f"DRESSAGE_SLIME_SOURCE={source} has no {CONTRACT}")
    probe = (
        "import sys, types\n"
        "for name in ('ray', 'sglang_router'):\n"
        "    sys.modules.setdefault(name, types.ModuleType(name))\n"
        "import slime.rollout.sglang_rollout\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=slime_env(source), capture_output=True, text=True, timeout=120
    )
    missing = re.search(r"No module named '([^']+)'", done.stderr)
    if done.returncode != 0 and missing:
        pytest.skip(
            f"slime's rollout module needs {missing.group(1)!r} here (pip install aiohttp pylatexenc)"
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return source


def real_log(tmp: Path) -> tuple[str, str]:
    """``dressage-worker rollout`` on a small letters run with an eval round; returns (run, url)."""
    rows = [
        '{"prompt": "Say a word with the letter e.", "label": "e"}',
        '{"prompt": "Say a word with the letter a.", "label": "a"}',
        '{"prompt": "Say a word with the letter o.", "label": "o"}',
    ]
    (tmp / "tasks.jsonl").write_text("\n".join(rows) + "\n")
    (tmp / "eval.jsonl").write_text("\n".join(rows[:2]) + "\n")
    cfg = {
        "run": "contract",
        "dataset": {"path": "tasks.jsonl"},
        "n_samples_per_prompt": 2,
        "engine": {"kind": "dev", "model": "tiny", "seed": 0},
        "sampling": {"max_tokens": 4, "seed": 0, "enable_thinking": False},
        "agent": {"kind": "answer"},
        "sandbox": {"provider": "local", "timeout_s": 20},
        "reward": {"kind": "contains"},
        "eval": {"name": "letters", "dataset": {"path": "eval.jsonl"}},
        "worker": {"concurrency": 4, "session_timeout_s": 60, "poll_s": 0.1},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
    url = f"sqlite:///{tmp / 'log.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DRESSAGE_HOME": str(tmp / "home"),
        "DRESSAGE_DATABASE_URL": url,
    }
    args = ["rollout", "--no-progress", "--config", str(tmp / "run.yaml")]
    done = subprocess.run(
        [sys.executable, "-c", "from dressage.cli import main; main()", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return "contract", url


@pytest.mark.timeout(900)  # a real rollout (dev engine start) and slime's imports in subprocesses
def test_slimes_own_rollout_contract_passes_on_a_real_log(tmp_path: Path) -> None:
    source = slime_source_or_skip()
    run, url = real_log(tmp_path)
    env = slime_env(source, DRESSAGE_RUN=run, DRESSAGE_DATABASE_URL=url, DRESSAGE_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [
            sys.executable,
            str(source / CONTRACT),
            "--rollout-function-path",
            PLUGIN,
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 6 and "failed" not in out, out[-2000:]
    store = EventStore.open(url, settings=Settings(database_url=url, home=tmp_path / "home"))
    try:
        ckpt = store.consumers.checkpoint(run, "train:slime")
        assert ckpt is not None and ckpt.step == 3 and ckpt.state["start_step"] == 2
        assert store.tasks.counts(run, kind="eval")["done"] == 2
    finally:
        store.close()
