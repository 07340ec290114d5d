"""A writer process for the concurrency and crash tests.

Appends turns into one run through the real store, re-sends some earlier keys, and prints
``ACK <turn_index> <position> <content_hash>`` after each acknowledged (committed) append.
"""

from __future__ import annotations

import sys

import numpy as np

from dressage.config import Settings
from dressage.store import EventStore, NewTurn


def make_turn(session_id: str, i: int) -> NewTurn:
    """The deterministic turn ``i`` of a writer's session."""
    rng = np.random.default_rng(i * 7919 + sum(session_id.encode()))
    return NewTurn(
        session_id=session_id,
        turn_index=i,
        context_ids=rng.integers(0, 248_000, 16),
        generated_ids=rng.integers(0, 248_000, 32),
        logprobs=-rng.random(32).astype(np.float32),
        policy_versions=[0] * 32,
    )


def main() -> None:
    url, run, session_id, start, count, resend_every = sys.argv[1:7]
    store = EventStore.open(settings=Settings(database_url=url), auto_upgrade=False)
    store.runs.create(run)
    store.sessions.open(run, session_id=session_id)
    for i in range(int(start), int(start) + int(count)):
        res = store.turns.append(run, make_turn(session_id, i))
        print(f"ACK {i} {res.position} {res.key}", flush=True)
        every = int(resend_every)
        if every and i % every == 0 and i >= 3:
            again = store.turns.append(run, make_turn(session_id, i - 3))
            assert again.duplicate, "a re-sent key must return the stored position"
            print(f"DUP {i - 3} {again.position} {again.key}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
