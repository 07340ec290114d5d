"""What a worker waits for when every remaining task is leased by someone else.

``rollout --resume`` after a crash finds the dead worker's tasks still leased: it can only wait for
them to be finished by their owner or for the leases to expire (``worker.lease_s``). Waiting with a
still progress bar looks like a hang, so the worker says what it waits for and until when.
"""

from __future__ import annotations

import time

from dressage.store import EventStore, Run


def describe_lease_wait(store: EventStore, run: Run, owner: str, *, now: float | None = None) -> str | None:
    """One line naming the tasks leased by other owners and when the last lease expires, or None
    when no other owner holds a lease."""
    rows = store.tasks.leases_of_others(run, owner)
    if not rows:
        return None
    n = sum(count for _, count, _ in rows)
    owners = ", ".join(o for o, _, _ in rows[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
    last = max(expiry for _, _, expiry in rows)
    left = max(0.0, last - (time.time() if now is None else now))
    until = time.strftime("%H:%M:%S UTC", time.gmtime(last))
    return (
        f"waiting for {n} task(s) leased by {owners}: they finish there, or their leases expire by "
        f"{until} (in {left:.0f} s; worker.lease_s) and are played here"
    )
