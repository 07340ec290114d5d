"""Small logs shared by several test packages: a one-turn session, a tiny loop's ``run.yaml``.

Kept at the top of ``tests`` so that the packages that need them (cli, view, harbor, store) import
one copy rather than each writing its own.
"""

from __future__ import annotations

from dressage.store import EventStore
from dressage.store.records import NewTurn


def record_one_turn_session(
    store: EventStore,
    run: str,
    sid: str,
    *,
    task_id: int,
    agent: str,
    ids: tuple[list[int], list[int]],
    version: int,
    reward: float,
) -> None:
    """Open session ``sid``, append one turn (``ids``: context and generated tokens) sampled at
    ``version``, and finish it with ``reward``."""
    store.sessions.open(run, session_id=sid, task_id=task_id, agent=agent)
    context, generated = ids
    turn = NewTurn(
        session_id=sid,
        turn_index=0,
        context_ids=context,
        generated_ids=generated,
        logprobs=[-0.1] * len(generated),
        policy_versions=[version] * len(generated),
    )
    store.turns.append(run, turn)
    store.sessions.finalize(sid, "finished", reward=reward, finish_reason="stop")


def tiny_loop_config(
    run: str, dataset: dict[str, object], *, reward: str, lr: float, iterations: int
) -> dict[str, object]:
    """A synchronous loop on the dev engine's tiny model, answer agents in bwrap sandboxes, two
    samples per prompt; training only ``lm_head``."""
    return {
        "run": run,
        "dataset": dataset,
        "n_samples_per_prompt": 2,
        "engine": {"kind": "dev", "model": "tiny", "seed": 0},
        "sampling": {"max_tokens": 4, "enable_thinking": False, "seed": 0},
        "agent": {"kind": "answer"},
        "sandbox": {"provider": "bwrap", "timeout_s": 20, "memory_mb": 512, "max_processes": 64},
        "reward": {"kind": reward},
        "worker": {"concurrency": 4, "lease_s": 30, "session_timeout_s": 60, "poll_s": 0.1},
        "train": {"lr": lr, "trainable": "lm_head"},
        "loop": {"iterations": iterations, "mode": "sync"},
    }
