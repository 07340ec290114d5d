"""The stop flag, the signal handlers and the log's stop requests, in this process (fast).

The drills with real worker processes are ``test_interrupts.py`` (rollout, fork, ``stop RUN``) and
``tests/loop/test_loop_interrupt.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dressage.cli import app
from dressage.config import Settings
from dressage.interrupts import StopFlag, install_signal_handlers
from dressage.rollout.stop_requests import STOP_EVENT, StopRequestWatch, lease_holders, request_stop
from dressage.store import EventStore, TaskSpec


@pytest.fixture
def restored_signals() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_the_first_request_wins_and_wakes_waiters_in_other_threads() -> None:
    flag = StopFlag()

    async def wait_for_it() -> str | None:
        threading.Timer(0.05, flag.request, args=("SIGTERM", 143)).start()
        await asyncio.wait_for(flag.wait(), timeout=10)
        return flag.reason

    assert asyncio.run(wait_for_it()) == "SIGTERM"
    assert flag.request("SIGINT", 130) is False  # later requests keep the first reason and code
    assert (flag.reason, flag.exit_code, flag.is_set()) == ("SIGTERM", 143, True)


def test_poll_runs_the_sources_until_one_stops() -> None:
    flag, calls = StopFlag(), []
    flag.sources.append(lambda: calls.append(1))
    assert flag.poll() is False and calls == [1]
    flag.sources.append(lambda: flag.request("a stop request", 143))
    assert flag.poll() is True and flag.poll() is True and calls == [1, 1]  # set: sources not run again


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN])
def test_sigint_sets_the_flag_whatever_was_inherited_and_a_second_one_forces(
    restored_signals: None, inherited: signal.Handlers
) -> None:
    signal.signal(signal.SIGINT, inherited)
    flag, said = StopFlag(), []
    install_signal_handlers(flag, said.append)
    os.kill(os.getpid(), signal.SIGINT)
    assert flag.is_set() and (flag.reason, flag.exit_code) == ("SIGINT", 130)
    assert said and said[0].startswith("SIGINT: stopping gracefully")
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_exits_143(restored_signals: None) -> None:
    flag = StopFlag()
    install_signal_handlers(flag, lambda _text: None)
    os.kill(os.getpid(), signal.SIGTERM)
    assert (flag.reason, flag.exit_code) == ("SIGTERM", 143)


def test_a_watch_obeys_requests_written_after_it_started(tmp_path: Path) -> None:
    store = EventStore.open(settings=Settings(database_url=f"sqlite:///{tmp_path / 'log.db'}", home=tmp_path))
    try:
        run = store.runs.create("r")
        request_stop(store, run, reason="an old one")
        flag = StopFlag()
        watch = StopRequestWatch(store, run, flag, interval_s=0).attach()
        store.tasks.enqueue(run, [TaskSpec(0, {})])  # other events are no stop request
        assert flag.poll() is False
        request_stop(store, run)
        assert flag.poll() is True and flag.exit_code == 143
        assert flag.reason is not None and flag.reason.startswith("a stop request from ")
        watch.detach()
        assert flag.sources == []
        assert [e.payload["reason"] for e in store.events.read(run, kinds=(STOP_EVENT,))] == [
            "an old one",
            "dressage-worker stop",
        ]
    finally:
        store.close()


def test_stop_reports_the_lease_holders(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    store = EventStore.open(settings=Settings(database_url=url, home=tmp_path))
    try:
        run = store.runs.create("r")
        store.tasks.enqueue(run, [TaskSpec(0, {}), TaskSpec(1, {})])
        store.tasks.claim(run, "node7-41", n=2, lease_s=600)
        assert [(h.owner, h.pairs) for h in lease_holders(store, run)] == [("node7-41", 2)]
        result = CliRunner().invoke(
            app, ["stop", "r", "--database-url", url], env={"DRESSAGE_HOME": str(tmp_path)}
        )
        assert result.exit_code == 0, result.output
        assert "asked run r to stop" in result.output and "node7-41: 2" in result.output
        waited = CliRunner().invoke(
            app,
            ["stop", "r", "--wait", "--timeout", "0", "--database-url", url],
            env={"DRESSAGE_HOME": str(tmp_path)},
        )
        assert waited.exit_code == 1 and "still has leases" in waited.output
        assert len(store.events.read(run, kinds=(STOP_EVENT,))) == 2
    finally:
        store.close()
