"""A multi-lineage session with hostile content, written through the EventStore API with real
Qwen3.5 token ids (what the proxy records for a coding agent that compacts, spawns a subagent,
retries and has one turn abandoned by its client).

Turns of session ``multi`` (segment / lineage / route):
  0  seg 0 / lin 0 / create   system + user prompt, thinking, a read_file tool call; routed experts
  1  seg 0 / lin 0 / append   a tool result holding <script>, </textarea>, a javascript: link and a
                              secret; the reply repeats the hostile text
  2  seg 1 / lin 1 / create   a subagent with its own context (boundary ``new_conversation``)
  3  seg 2 / lin 0 / branch   a retry of turn 1 from turn 0; policy versions 0 -> 1 inside the turn
  4  seg 3 / lin 0 / create   a compaction (boundary ``template_prefix_mismatch``)
  5  seg 4 / lin 0 / branch   abandoned by the client (``client_disconnected``, finish ``abort``)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dressage.store import EventStore, NewTurn, TaskSpec, turn_key
from dressage.tito.tokenizer import load_qwen35_tokenizer
from dressage.training import StepOptions, Trainer
from tests.log_builders import record_one_turn_session

HOSTILE = "<script>alert('pwned')</script></textarea><a href=\"javascript:alert(2)\">click</a>"
SECRET = "sk-live0123456789abcdefXYZ"
SYSTEM = "You are a coding agent."
USER = "Fix the bug in app.py"


@dataclass
class MultiSession:
    """What was written: run, session id, the records, and the texts to look for."""

    run: str
    session_id: str
    records: list[NewTurn] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)


def _prompt(system: str, user: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n"


def build_multi_session(store: EventStore, run: str, session_id: str = "multi-lineage") -> MultiSession:
    """Write the session described in the module docstring (finished, reward 0.5, one artifact)."""
    tok = load_qwen35_tokenizer()
    enc = tok.encode
    store.runs.create(run, {"model": "qwen3.5", "note": HOSTILE})
    store.versions.record(run, 0)
    store.versions.record(run, 1)
    store.sessions.open(run, session_id=session_id, agent="coder", sandbox="bwrap")
    m = MultiSession(run, session_id)
    rng = np.random.default_rng(1)
    call = (
        "I should read the file first.\n</think>\n\n<tool_call>\n<function=read_file>\n"
        "<parameter=path>\napp.py\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    tool_result = f"\n<|im_start|>user\n<tool_response>\n{HOSTILE}\napi_key={SECRET}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    answer = (
        f"The file prints markup.\n</think>\n\nThe page contains {HOSTILE} which must stay text.<|im_end|>"
    )
    sub_prompt = _prompt(SYSTEM, "Subagent: list the tests")
    sub_reply = "Listing.\n</think>\n\ntests/test_app.py<|im_end|>"
    retry = "Let me retry.\n</think>\n\nFixed by escaping.<|im_end|>"
    compact = _prompt(SYSTEM, "Summary so far: the bug is fixed. Continue.")
    compact_reply = "Done.\n</think>\n\nAll good.<|im_end|>"
    abandoned = "Partial answ"

    def rec(i: int, ctx: str, gen: str, **kw: object) -> NewTurn:
        ctx_ids, gen_ids = enc(ctx), enc(gen)
        lps = kw.pop("logprobs", None)
        vers = kw.pop("versions", None)
        return NewTurn(
            session_id=session_id,
            turn_index=i,
            context_ids=ctx_ids,
            generated_ids=gen_ids,
            logprobs=lps if lps is not None else (-rng.exponential(0.8, len(gen_ids))).tolist(),
            policy_versions=vers if vers is not None else [0] * len(gen_ids),
            latency_ms=100.0 + 10 * i,
            **kw,  # type: ignore[arg-type]
        )

    t0 = rec(0, _prompt(SYSTEM, USER), call, route="create", finish_reason="stop")
    n0 = len(t0.context_ids) + len(t0.generated_ids)
    t0.routed_experts = rng.integers(0, 128, size=(n0 - 1, 2, 4)).astype(np.uint8)
    t1 = rec(
        1,
        tool_result,
        answer,
        route="append",
        finish_reason="stop",
        segment_offset=n0,
        parent_turn_id=turn_key(run, session_id, 0),
    )
    t2 = rec(
        2,
        sub_prompt,
        sub_reply,
        route="create",
        thread_index=1,
        segment_index=1,
        boundary_reason="new_conversation",
        finish_reason="stop",
    )
    retry_ctx = _prompt(SYSTEM, USER) + call + tool_result
    n_retry = len(enc(retry))
    t3 = rec(
        3,
        retry_ctx,
        retry,
        route="branch",
        segment_index=2,
        boundary_reason="retry",
        parent_turn_id=turn_key(run, session_id, 0),
        finish_reason="stop",
        versions=[0] * (n_retry // 2) + [1] * (n_retry - n_retry // 2),
    )
    t4 = rec(
        4,
        compact,
        compact_reply,
        route="create",
        segment_index=3,
        boundary_reason="template_prefix_mismatch",
        finish_reason="stop",
        versions=[1] * len(enc(compact_reply)),
    )
    t5 = rec(
        5,
        compact
        + compact_reply
        + "\n<|im_start|>user\nOne more thing<|im_end|>\n<|im_start|>assistant\n<think>\n",
        abandoned,
        route="branch",
        segment_index=4,
        boundary_reason="client_disconnected",
        parent_turn_id=turn_key(run, session_id, 4),
        finish_reason="abort",
        loss_mask=[False] * len(enc(abandoned)),
        versions=[1] * len(enc(abandoned)),
    )
    m.records = [t0, t1, t2, t3, t4, t5]
    for r in m.records:
        store.turns.append(run, r)
    store.events.append(
        run, "reward", {"reward": 0.5, "details": {"tests_passed": 1, "note": HOSTILE}}, session_id=session_id
    )
    store.artifacts.put(
        run, f"agent log\n{HOSTILE}\n".encode(), name="<script>agent.log", session_id=session_id
    )
    store.sessions.finalize(session_id, "finished", reward=0.5, finish_reason="stop")
    m.texts = {"hostile": HOSTILE, "secret": SECRET, "user": USER}
    return m


def append_live_turn(store: EventStore, run: str, session_id: str, index: int, text: str) -> NewTurn:
    """Append one more turn to a running session (for the live-update test)."""
    tok = load_qwen35_tokenizer()
    ids = tok.encode(text + "<|im_end|>")
    rec = NewTurn(
        session_id=session_id,
        turn_index=index,
        context_ids=tok.encode(_prompt(SYSTEM, f"live turn {index}")),
        generated_ids=ids,
        logprobs=[-0.1] * len(ids),
        policy_versions=[0] * len(ids),
        route="create",
        segment_index=100 + index,
        finish_reason="stop",
        latency_ms=5.0,
    )
    store.turns.append(run, rec)
    return rec


@dataclass
class EvalRun:
    """A run whose group 0 has two training sessions and two eval sessions (same group index)."""

    run: str
    train: dict[str, float]
    evals: dict[str, tuple[int, float]]


def build_eval_run(store: EventStore, run: str) -> EvalRun:
    """Training sessions of task 0 (rewards 1 and 0, policy 0) and eval sessions of policy 0 (task 0,
    so group 0 too; rewards 0 and 0) and policy 1 (task 1; reward 1): a mix of the two at version 0
    would read 0.25."""
    store.runs.create(run, {"model": "qwen3.5"})
    store.versions.record(run, 0)
    store.versions.record(run, 1)
    store.tasks.enqueue(run, [TaskSpec(task_index=0, payload={"prompt": "train"})], n_samples=2)
    for v in (0, 1):
        store.tasks.enqueue(
            run, [TaskSpec(task_index=v, payload={"prompt": "eval"})], n_samples=2 - v, eval_version=v
        )
    out = EvalRun(run, {}, {})
    for i, pair in enumerate(sorted(store.tasks.pairs(run), key=lambda p: (p.kind, p.id))):
        evaluating = pair.kind == "eval"
        version = store.tasks.kind_of(pair.id)[1] or 0
        reward = (1.0 - pair.sample_index) if not evaluating else float(version)
        sid = f"{run}-{pair.kind}-{i}"
        ids = ([9707, 11], [1234])
        record_one_turn_session(
            store, run, sid, task_id=pair.id, agent="python", ids=ids, version=version, reward=reward
        )
        if evaluating:
            out.evals[sid] = (version, reward)
        else:
            out.train[sid] = reward
    return out


@dataclass
class ForkTree:
    """A fork tree written through the store: ``root`` (4 turns), its forks ``a`` and ``b`` at turn 2,
    and ``a``'s fork ``aa`` at turn 3; each fork's shared turns copied id for id."""

    run: str
    root: str
    a: str
    b: str
    aa: str
    rewards: dict[str, float]


def _copy_turns(store: EventStore, run: str, parent: str, child: str, k: int) -> None:
    """Append the parent's turns ``0..k-1`` to ``child``, as the proxy copies them for a fork."""
    for t in store.turns.read(session_id=parent)[:k]:
        store.turns.append(run, NewTurn.from_turn(t, child, info={**t.info, "replayed_from": t.id}))


def _live_turns(store: EventStore, run: str, session: str, start: int, end: int) -> None:
    enc = load_qwen35_tokenizer().encode
    offset = sum(len(t.context_ids) + len(t.generated_ids) for t in store.turns.read(session_id=session))
    for i in range(start, end):
        context = enc(f"\n<|im_start|>user\nstep {i} of {session}<|im_end|>\n<|im_start|>assistant\n")
        generated = enc(f"done {i}<|im_end|>")
        route = "create" if i == 0 else "append"
        store.turns.append(
            run,
            NewTurn(
                session, i, context, generated, [-0.5] * len(generated), [0] * len(generated),
                route=route, segment_offset=offset, finish_reason="stop",
            ),
        )  # fmt: skip
        offset += len(context) + len(generated)


def build_fork_tree(store: EventStore, run: str) -> ForkTree:
    """Write the tree described in :class:`ForkTree` (every session finished with a reward)."""
    store.runs.create(run, {"model": "qwen3.5"})
    tree = ForkTree(run, f"{run}-root", f"{run}-a", f"{run}-b", f"{run}-aa", {})
    tree.rewards = {tree.root: 0.25, tree.a: 0.5, tree.b: 1.0, tree.aa: 0.0}
    store.sessions.open(run, session_id=tree.root, agent="coder")
    _live_turns(store, run, tree.root, 0, 4)
    for child, parent, k in ((tree.a, tree.root, 2), (tree.b, tree.root, 2), (tree.aa, tree.a, 3)):
        store.sessions.open(run, session_id=child, agent="coder", parent_session_id=parent, fork_turn=k)
        _copy_turns(store, run, parent, child, k)
        _live_turns(store, run, child, k, 4 if child != tree.a else 3)
    for sid, reward in tree.rewards.items():
        store.sessions.finalize(sid, "finished", reward=reward)
    return tree


METRIC_VALUES: dict[str, list[float]] = {
    "is_ratio_mean": [1.0, 1.00000005, 0.99999993, 1.0, 1.00000002, 0.99999998],  # on-policy
    "loss": [1.2e-9, -2.5e-9, 3.1e-9, 0.4e-9, -1.0e-9, 2.2e-9],
    "kl_behaviour": [1.1e-13, 3.0e-13, 2.4e-13, 0.7e-13, 4.6e-13, 1.9e-13],
    "grad_norm": [0.8, 0.3, 0.0, 0.0, 0.0, 0.0],
    "entropy": [12.4, 9.1, 3.2, 0.5, 0.07, 0.06],
    "trained_tokens": [40.0, 40.0, 40.0, 40.0, 40.0, 40.0],  # constant
}
"""Step metrics as a collapsed on-policy run records them: near-constant and tiny values."""


def build_metric_run(store: EventStore, run: str) -> None:
    """A run with training sessions at policy versions 0..2 and six committed steps of
    ``train:main`` with :data:`METRIC_VALUES`."""
    store.runs.create(run, {"model": "qwen3.5"})
    for v in range(3):
        store.versions.record(run, v)
    store.tasks.enqueue(run, [TaskSpec(task_index=i, payload={"prompt": "p"}) for i in range(3)], n_samples=1)
    for i, pair in enumerate(sorted(store.tasks.pairs(run), key=lambda p: p.task_index)):
        record_one_turn_session(
            store, run, f"{run}-{i}", task_id=pair.id, agent="python", ids=([9707], [11]), version=i,
            reward=0.25 * i,
        )  # fmt: skip
    for step in range(1, 7):
        metrics = {name: values[step - 1] for name, values in METRIC_VALUES.items()}
        manifest = {"trainer_version": step - 1, "samples": [], "groups": []}
        store.consumers.commit_step(
            run, "train:main", step=step, position=step, batch_hash=f"{step:064x}", manifest=manifest,
            metrics=metrics,
        )  # fmt: skip


def build_trained_tree(store: EventStore, run: str) -> list[str]:
    """The tree of :mod:`tests.training.test_trees` (roots R and S of one group; R forked into A and
    B at turn 2, A into C at turn 3), its forks opened without a task as ``fork`` opens them, trained
    in one step by the tree estimator; its session ids ``{run}-R`` ..."""
    from tests.training.test_trees import _session

    rng = np.random.default_rng(7)
    store.runs.create(run, {"rollout": {"branching": {"width": 2}}})
    store.tasks.enqueue(run, [TaskSpec(0, {"prompt": "p"})], n_samples=2)
    first, second = sorted(store.tasks.claim(run, "w", n=2), key=lambda x: x.sample_index)
    _session(store, run, "R", first.task_id, 4, 1.0, rng=rng)
    _session(store, run, "A", None, 4, 0.0, "R", 2, rng)  # type: ignore[arg-type]
    _session(store, run, "C", None, 4, 1.0, "A", 3, rng)  # type: ignore[arg-type]
    _session(store, run, "B", None, 4, 0.5, "R", 2, rng)  # type: ignore[arg-type]
    _session(store, run, "S", second.task_id, 2, 0.0, rng=rng)
    store.tasks.release(second, "done")
    store.tasks.release(first, "done")
    options = StepOptions(global_batch_size=2, n_samples_per_prompt=2, advantage_estimator="tree")
    assert len(Trainer(store, run, options).run_steps()) == 1
    return [f"{run}-{x}" for x in "RACBS"]
