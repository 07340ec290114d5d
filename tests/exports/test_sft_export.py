"""``export --format sft``: a quickstart-like run (the Qwen3.5 profile, the answer agent's system
prompt, thinking off, rewarded and unrewarded answers, plus a session with a tool call) exported
with ``--where "reward >= 1 AND kind = 'train'"``, loaded by TRL's SFT dataset preparation, whose
tokenization must equal the recorded ids; an altered row is flagged.

The turns are recorded as the proxy records them: each turn's context is the profile's rendering
of the conversation so far minus what the lineage already holds, the generation ends at
``<|im_end|>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dressage.errors import StoreError
from dressage.exports.export import export_run
from dressage.exports.sft import SFT_FILE, SftRows
from dressage.exports.verify import verify_export
from dressage.store import EventStore, NewTurn, TaskSpec
from dressage.tito.model_profile import ModelProfile
from dressage.tito.profiles import RUN_RECORD_KEY, build_profile, profile_record
from tests.cli.helpers import invoke
from tests.exports.sft_checks import trl_prepare
from tests.pg_roles import reader_url
from tests.stores import open_store

SYSTEM = "You answer in as few words as possible."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
CALL = "<tool_call>\n<function=lookup>\n<parameter=word>\nzebra\n</parameter>\n</function>\n</tool_call>"
ANSWERS = {  # (task, sample) -> (answer, reward)
    (0, 0): ("a", 1.0),
    (0, 1): ("b", 0.0),
    (1, 0): ("Zebra is", 1.0),  # cut by max_tokens: no <|im_end|>
    (1, 1): ("x y", 0.0),
}


@pytest.fixture(scope="module")
def profile() -> ModelProfile:
    return build_profile("qwen3.5")


def _record(
    store: EventStore,
    run: str,
    sid: str,
    profile: ModelProfile,
    turns: list[tuple[list[dict[str, Any]], str]],
    tools: list[dict[str, Any]] | None,
) -> None:
    """Append the turns of one session: (conversation so far, generated text) each."""
    tok = profile.tokenizer
    held: list[int] = []
    for i, (messages, generated) in enumerate(turns):
        prompt = profile.render(messages, tools, True, False)
        held_text = tok.decode(held)
        assert prompt.startswith(held_text)
        context = [int(x) for x in tok.encode(prompt[len(held_text) :])]
        cut = generated == "Zebra is"
        gen = [int(x) for x in tok.encode(generated)] + ([] if cut else [profile.turn_end_id])
        store.turns.append(
            run,
            NewTurn(
                session_id=sid,
                turn_index=i,
                segment_offset=len(held),
                context_ids=context,
                generated_ids=gen,
                logprobs=[-0.5] * len(gen),
                policy_versions=[0] * len(gen),
                finish_reason="length" if cut else "stop",
                sampling_params={"temperature": 1.0, **({"tools": tools} if tools else {})},
            ),
        )
        held += context + gen


def build_quickstart_like(store: EventStore, run: str, profile: ModelProfile) -> None:
    """Two letter tasks x 2 samples, one eval task, and a rewarded tool-calling session."""
    store.runs.create(run, {"model": "tiny", RUN_RECORD_KEY: profile_record(profile)})
    store.versions.record(run, 0)
    store.tasks.enqueue(run, [TaskSpec(0, {}), TaskSpec(1, {}), TaskSpec(2, {})], n_samples=2)
    store.tasks.enqueue(run, [TaskSpec(0, {})], n_samples=1, eval_version=0)
    while leases := store.tasks.claim(run, "test-worker", n=1):
        lease = leases[0]
        sid = f"{run}-{lease.kind}-t{lease.task_index}-s{lease.sample_index}"
        store.sessions.open(run, session_id=sid, task_id=lease.task_id, attempt=lease.attempt, agent="answer")
        question = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Name a word with letter {lease.task_index}."},
        ]
        if lease.task_index == 2:  # a tool call, its result, then the answer
            call = {
                "role": "assistant",
                "content": "",
                "reasoning_content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "lookup", "arguments": {"word": "zebra"}}}
                ],
            }
            second = [*question, call, {"role": "tool", "content": "a striped horse"}]
            turns = [(question, CALL), (second, "horse")]
            _record(store, run, sid, profile, turns, TOOLS)
            reward = 1.0
        else:
            answer, reward = ANSWERS.get((lease.task_index, lease.sample_index), ("q", 1.0))
            _record(store, run, sid, profile, [(question, answer)], None)
        store.sessions.finalize(sid, "finished", reward=reward, finish_reason="stop")
        store.tasks.release(lease, "done")


def test_sft_export_loads_in_trl_and_tokenizes_to_the_recorded_ids(
    store: EventStore, db_url: str, run_name: str, profile: ModelProfile, tmp_path: Path
) -> None:
    build_quickstart_like(store, run_name, profile)
    out = tmp_path / "sft"
    where = "reward >= 1 AND kind = 'train'"
    with open_store(reader_url(db_url), tmp_path / "home") as reader:  # --where runs as a reader
        manifest = export_run(reader, run_name, out, where=where, fmt="sft")
    assert verify_export(out) == manifest and manifest["complete"] is False
    rows = pq.read_table(out / SFT_FILE).to_pylist()
    rewarded = {
        f"{run_name}-train-t0-s0",
        f"{run_name}-train-t1-s0",
        f"{run_name}-train-t2-s0",
        f"{run_name}-train-t2-s1",
    }
    assert {r["session_id"] for r in rows} == rewarded and all(r["reward"] >= 1 for r in rows)
    assert all(r["exact"] and r["mismatch_reason"] is None for r in rows)
    truncated = {r["session_id"] for r in rows if r["truncated"]}
    assert truncated == {f"{run_name}-train-t1-s0"}
    newline = [int(x) for x in profile.tokenizer.encode("\n")]
    for r in rows:
        closing = [profile.turn_end_id] if r["truncated"] else []
        assert r["template_tail_ids"] == closing + newline
    assert manifest["counts"]["flagged"] == 0
    recorded = {}
    for r in rows:
        turns = store.turns.read(session_id=r["session_id"])
        ids: list[int] = []
        for turn in turns:
            ids += [int(x) for x in turn.context_ids] + [int(x) for x in turn.generated_ids]
        recorded[r["session_id"]] = ids
        assert r["token_ids"] == ids  # the recorded ids, exactly
        assert len(r["assistant_mask"]) == len(ids) and sum(r["assistant_mask"]) == sum(
            len(t.generated_ids) for t in turns
        )
    tool_row = next(r for r in rows if r["session_id"].endswith("t2-s0"))
    assert [m["role"] for m in tool_row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert tool_row["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"word": "zebra"}
    assert json.loads(tool_row["tools"]) == TOOLS
    prepared = trl_prepare(out, profile, tmp_path)
    assert len(prepared) == len(rows)
    for row, got in zip(rows, prepared, strict=True):
        assert got["input_ids"] == recorded[row["session_id"]] + row["template_tail_ids"]


def test_an_altered_row_is_flagged(
    store: EventStore, db_url: str, run_name: str, profile: ModelProfile, tmp_path: Path
) -> None:
    build_quickstart_like(store, run_name, profile)
    with open_store(reader_url(db_url), tmp_path / "home") as reader:  # --where runs as a reader
        export_run(reader, run_name, tmp_path / "sft", where="reward >= 1 AND kind = 'train'", fmt="sft")
    rows = pq.read_table(tmp_path / "sft" / SFT_FILE).to_pylist()
    checker = SftRows(profile)
    assert all(checker.check(r)["exact"] for r in rows)
    altered = dict(rows[0], messages=[dict(m) for m in rows[0]["messages"]])
    altered["messages"][-1]["content"] += " (edited)"
    flagged = checker.check(altered)
    assert flagged["exact"] is False and "differ from the recorded ids" in flagged["mismatch_reason"]
    # Parquet unifies structs: a tool-call argument another row has reads back as null, and is caught
    tool_row = next(r for r in rows if r["tools"] is not None)
    call = tool_row["messages"][2]["tool_calls"][0]
    call["function"]["arguments"] = {**call["function"]["arguments"], "other": None}
    assert checker.check(tool_row)["exact"] is False


def test_an_unparsable_profile_is_refused(
    store: EventStore, run_name: str, tmp_path: Path, db_url: str
) -> None:
    store.runs.create(run_name, {RUN_RECORD_KEY: {"model_profile": "mistral-nemo", "template_sha256": "x"}})
    with pytest.raises(StoreError, match="model profile 'mistral-nemo'"):
        export_run(store, run_name, tmp_path / "sft", fmt="sft")
    result = invoke(CliRunner(), db_url, "export", run_name, "--to", str(tmp_path / "x"), "--format", "sft")
    assert result.exit_code == 1 and "model profile 'mistral-nemo'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
