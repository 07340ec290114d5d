"""``dressage-worker stop RUN``: ask every process working on a run to stop gracefully.

The request is an event in the run's log (:mod:`dressage.rollout.stop_requests`), which every worker
of the run reads wherever it runs: rollout workers and Ray worker actors see it at their next claim,
the loop, a fork and ``train --follow`` between steps. Each stops as on SIGTERM: no new claims, its
in-flight sessions left running with their leases handed back (``--resume`` takes them over at
once), its engine stopped last, exit code 143. ``--wait`` waits until no lease of the run is held.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from dressage.commandline import DatabaseUrl, handle_errors
from dressage.commandline import console as make_console
from dressage.config import load_settings, require_database_file
from dressage.errors import DressageError

if TYPE_CHECKING:  # the store is imported by the command itself: the CLI starts without it
    from dressage.rollout.stop_requests import LeaseHolder
    from dressage.store import EventStore


@handle_errors
def stop_command(
    run: Annotated[str, typer.Argument(help="The run to stop (its name).")],
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until no lease of the run is held.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="With --wait: give up after this many seconds.", min=0)
    ] = 300.0,
    database_url: DatabaseUrl = None,
) -> None:
    """Ask every worker of RUN (on any machine) to stop gracefully; they exit 143 and say how to resume."""
    from dressage.rollout.stop_requests import lease_holders, request_stop
    from dressage.store import EventStore

    settings = load_settings(database_url=database_url)
    require_database_file(settings.resolved_database_url())
    store = EventStore.open(settings=settings, auto_upgrade=False, pool_size=1)
    console = make_console()
    try:
        name = store.runs.get(run).name
        position = request_stop(store, name)
        holders = lease_holders(store, name)
        console.print(
            f"asked run {name} to stop (stop request at position {position}): "
            + (_describe(holders) if holders else "no worker holds a lease of it now"),
            soft_wrap=True,
            markup=False,
        )
        if wait and holders:
            _wait_for_release(store, name, timeout)
            console.print(f"stopped: no lease of the run is held; resume with --resume {name}", markup=False)
    finally:
        store.close()


def _describe(holders: list[LeaseHolder]) -> str:
    """``N worker(s) hold leases (owner: pairs, ...); they stop at their next claim``."""
    owners = ", ".join(f"{h.owner}: {h.pairs}" for h in holders)
    return f"{len(holders)} worker(s) hold leases ({owners}); each stops at its next claim"


def _wait_for_release(store: EventStore, run: str, timeout: float) -> None:
    """Return once no unexpired lease of ``run`` is held; raise after ``timeout`` seconds."""
    from dressage.rollout.stop_requests import lease_holders

    deadline = time.monotonic() + timeout
    while holders := lease_holders(store, run):
        if time.monotonic() > deadline:
            raise DressageError(
                f"run {run} still has leases after {timeout:g} s ({_describe(holders)}); a worker that "
                "does not stop is stuck or from a version without stop requests: SIGTERM it"
            )
        time.sleep(0.5)
