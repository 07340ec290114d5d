"""``dressage-worker loop`` on the quickstart (one iteration, with a reference model): SQL over the
log returns every step metric, each equal to what the trainer computed; step 1's loss and gradient
norm recomputed from the samples the log gives back equal the recorded ones; and the per-token
decisions of the step are in the ``token_decisions`` view."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dressage.store import EventStore
from dressage.store.views import STEP_METRIC_COLUMNS
from dressage.training import StepOptions, Trainer
from dressage.training.torch_backend import build_model
from tests.quickstart_run import REPO
from tests.training.builders import recompute_loss_and_grad_norm

pytestmark = pytest.mark.timeout(900)

RUN = "quickstart-sync"
"""The run a sync loop on the quickstart makes (``<run>-<mode>``, docs/loop.md)."""


def _sql(work: Path, env: dict[str, str], query: str) -> list[dict]:
    done = subprocess.run(
        [".venv/bin/dressage-worker", "sql", "--json", query],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _recompute_step_1(store: EventStore) -> tuple[float, float]:
    """Step 1's loss and grad norm: the engine's initial model (the loop trains from it), only the
    output projection trainable (the quickstart's ``train.trainable: lm_head``), on the replayed batch."""
    steps = store.consumers.steps(RUN, "train:loop")
    options = StepOptions.from_dict(steps[0].manifest["options"])
    batch = Trainer(store, RUN, options, consumer="loop").replay(upto=1)[0]
    model = build_model("tiny", seed=0)
    model.train()
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("lm_head."))
    return recompute_loss_and_grad_norm(model, batch.samples)


def test_loop_on_the_quickstart_puts_every_metric_in_sql(tmp_path: Path) -> None:
    from tests.paddock.conftest import bwrap_unavailable_reason

    reason = bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"the quickstart needs bubblewrap: {reason}")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    config = tmp_path / "examples" / "quickstart.yaml"
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["train"]["reference"] = "initial"  # the quickstart plus a reference model: kl_reference too
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env["PYTHONPATH"] = str(REPO)
    command = [
        ".venv/bin/dressage-worker",
        "loop",
        "--config",
        "examples/quickstart.yaml",
        "-k",
        "1",
        "--no-progress",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _sql(tmp_path, env, "SELECT * FROM step_metrics WHERE run_name = 'quickstart-sync' ORDER BY step")
    assert [r["step"] for r in rows] == [1]
    missing = [c for c in STEP_METRIC_COLUMNS if rows[0][c] is None and c != "kl_loss"]  # kl_coef is 0
    assert not missing, missing
    store = EventStore.open(f"sqlite:///{tmp_path / '.dressage' / 'dressage.db'}")
    try:
        recorded = store.consumers.metrics(RUN, "train:loop")[1]
        for name in STEP_METRIC_COLUMNS:
            if name in recorded:  # the view holds exactly what the trainer recorded
                assert rows[0][name] == pytest.approx(recorded[name], rel=1e-12, abs=1e-300), name
        assert recorded["kl_reference"] == 0.0  # step 1 trains the reference weights themselves
        loss, grad_norm = _recompute_step_1(store)
    finally:
        store.close()
    assert loss == pytest.approx(recorded["loss"], rel=1e-5)
    assert grad_norm == pytest.approx(recorded["grad_norm"], rel=1e-5) and grad_norm > 0
    reasons = _sql(
        tmp_path,
        env,
        "SELECT mask_reason, COUNT(*) AS n, COUNT(importance_weight) AS weighted FROM token_decisions "
        "WHERE run_name = 'quickstart-sync' GROUP BY mask_reason ORDER BY mask_reason",
    )
    by_reason = {r["mask_reason"]: r for r in reasons}
    assert set(by_reason) == {"prompt", "trained"}  # a single-turn answer: prompt, then its reply
    assert by_reason["trained"]["n"] == recorded["trained_tokens"] == by_reason["trained"]["weighted"]
