"""Stop requests in the log: ``dressage-worker stop RUN`` asks every process working on a run to stop.

The log is what every worker of a run shares, on every machine, so a stop request is an event of
the run (``run_stop_requested``: who asked, and why). A process that works on the run (a rollout
worker, a Ray worker actor, the loop, a fork, ``train --follow``) watches for one written after
it started (:class:`StopRequestWatch`, polled at most every ``interval_s`` between claims), and
then stops as on SIGTERM (:mod:`dressage.interrupts`): no new claims, in-flight sessions left for
``--resume`` to take over, exit code 143. A request written before a process started is history,
not an order: ``--resume`` after a stop runs.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass

from dressage.interrupts import STOP_REQUEST_EXIT_CODE, StopFlag, announce
from dressage.store import EventStore, Run

STOP_EVENT = "run_stop_requested"
"""The event kind of a stop request."""


def requester() -> str:
    """``user@host:pid`` of this process: who asked (recorded with the request)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def request_stop(store: EventStore, run: str | Run, reason: str = "dressage-worker stop") -> int:
    """Append a stop request to ``run``'s log; its position."""
    payload = {"by": requester(), "reason": reason, "at": time.time()}
    return store.events.append(run, STOP_EVENT, payload).position


@dataclass
class LeaseHolder:
    """A worker that holds leases of a run: it is what a stop request stops."""

    owner: str
    pairs: int
    expires_in_s: float


def lease_holders(store: EventStore, run: str | Run) -> list[LeaseHolder]:
    """The owners of the run's leases that have not expired (handed-back leases have)."""
    now = time.time()
    return [
        LeaseHolder(owner, n, expires - now)
        for owner, n, expires in store.tasks.leases_of_others(run, "")
        if expires > now
    ]


class StopRequestWatch:
    """Requests ``flag`` to stop once a stop request newer than this watch appears in ``run``'s log.

    :meth:`poll` (blocking: two small indexed reads, at most every ``interval_s``) is added to the
    flag's sources by :meth:`attach`, so whoever polls the flag polls the log too.
    """

    def __init__(self, store: EventStore, run: str | Run, flag: StopFlag, interval_s: float = 1.0) -> None:
        self.store, self.run, self.flag, self.interval_s = store, run, flag, interval_s
        self.after = store.events.last_position(run)
        self._next = 0.0

    def attach(self) -> StopRequestWatch:
        """Add this watch to the flag's sources; returns it."""
        self.flag.sources.append(self.poll)
        return self

    def detach(self) -> None:
        """Remove this watch from the flag's sources (idempotent)."""
        if self.poll in self.flag.sources:
            self.flag.sources.remove(self.poll)

    def poll(self) -> None:
        """Look for a new stop request (rate-limited); on one, request the flag to stop."""
        now = time.monotonic()
        if now < self._next or self.flag.is_set():
            return
        self._next = now + self.interval_s
        last = self.store.events.last_position(self.run)
        if last <= self.after:
            return
        found = self.store.events.read(self.run, after=self.after, limit=1, kinds=(STOP_EVENT,))
        self.after = last
        if found:
            by = found[0].payload.get("by", "?")
            if self.flag.request(f"a stop request from {by}", STOP_REQUEST_EXIT_CODE):
                announce(
                    f"stop requested by {by}: stopping gracefully (no new work; what is in flight is left to resume)"
                )
