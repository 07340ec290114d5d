"""An abandoned turn (the client went away mid-stream) is recorded with loss mask 0, and the trainer
reports its tokens as ``recorded_untrained`` in the ``token_decisions`` view: only the retry's
answer is trained. Real proxy, real dev engine, SQLite and PostgreSQL."""

from __future__ import annotations

import time

from openai import OpenAI
from typer.testing import CliRunner

from dressage.store import TaskSpec
from dressage.training import StepOptions, Trainer
from tests.cli.helpers import sql_json
from tests.proxy.conftest import Harness
from tests.proxy.helpers import NOTHINK, abandon_mid_stream

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_an_abandoned_turn_is_recorded_untrained(proxy_any: Harness, db_url: str) -> None:
    proxy, store = proxy_any, proxy_any.store
    run = proxy.run()
    store.tasks.enqueue(run, [TaskSpec(0, {"prompt": "colour"})], n_samples=1)
    [lease] = store.tasks.claim(run, "test-worker", n=1)
    s = proxy.loop.call(proxy.server.open_session(run, task_id=lease.task_id, agent="test"))
    abandon_mid_stream(proxy.server.base_url, s.token, MSGS)
    deadline = time.monotonic() + 30
    while not store.turns.read(run, session_id=s.session_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    client = OpenAI(base_url=s.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=5, seed=4, extra_headers={"Idempotency-Key": "turn-1"},
        extra_body=NOTHINK,
    )  # fmt: skip
    aborted, retry = store.turns.read(run, session_id=s.session_id)
    assert (aborted.finish_reason, aborted.boundary_reason) == ("abort", "client_disconnected")
    assert aborted.generated_ids.size >= 3 and not aborted.loss_mask.any()  # recorded: mask 0
    assert retry.loss_mask.all()
    store.sessions.finalize(s.session_id, "finished", reward=1.0)
    store.tasks.release(lease, "done")

    [result] = Trainer(store, run, StepOptions(1, 1)).run_steps()

    rows = sql_json(
        CliRunner(env={"COLUMNS": "200"}),
        db_url,
        "SELECT segment_index, position, token_id, mask_reason FROM token_decisions "
        f"WHERE run_name = '{run}' ORDER BY segment_index, position",
    )
    by_segment: dict[int, list[dict]] = {}
    for row in rows:
        by_segment.setdefault(row["segment_index"], []).append(row)
    dead = by_segment[aborted.segment_index]
    response = dead[aborted.context_ids.size :]
    assert [r["token_id"] for r in response] == aborted.generated_ids.tolist()
    assert {r["mask_reason"] for r in response} == {"recorded_untrained"}
    assert {r["mask_reason"] for r in dead[: aborted.context_ids.size]} == {"prompt"}
    live = by_segment[retry.segment_index]
    trained = [r["mask_reason"] for r in live[retry.context_ids.size :]]
    assert trained == ["trained"] * retry.generated_ids.size
    # the step trains the retry's tokens only
    assert result.batch.manifest["n_trainable_tokens"] == retry.generated_ids.size
