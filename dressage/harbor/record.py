"""A finished Harbor job into the event log: the job is a run, each trial a session.

``python -m dressage.harbor.record JOB_DIR [--run NAME] [--key K]`` (Python 3.11 or 3.12; only
Harbor's output files are read, never its internals) walks the trial directories of a job
(``harbor run -o JOBS`` writes ``JOBS/<job>/<trial>/result.json``) and, per trial:

- numbers the trials of each task in start order (Harbor's ``--n-attempts``): the attempt;
- finds the session :class:`dressage.harbor.agent.Agent` opened for it (its ``info.trial_name``), or
  opens one (trials of Harbor's own agents, e.g. ``oracle``, made no model call through us);
- appends a ``reward`` event with all of the verifier's rewards and finalizes the session
  ``finished`` with the trained number (``--key``, else the only or the ``reward`` key), or
  ``failed`` with the trial's exception (type and message) or the reward problem (several rewards
  and no rule picking one: ``finished``, rewards whole, a NULL reward and ``info.no_scalar_reward``);
- stores ``result.json`` (and the verifier's ``test-stdout.txt``) as the session's artifacts.

Recording again is a no-op (deterministic event keys, content-addressed artifacts, finalize is
idempotent), so it can run after every ``harbor run`` of a resumed job.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dressage.config import load_settings
from dressage.errors import DressageError, NoScalarRewardError, RewardError
from dressage.harbor.verifier import select_reward
from dressage.store import EventStore, Run, deterministic_key


def trial_results(job_dir: Path) -> list[tuple[Path, dict[str, object]]]:
    """``(trial directory, parsed result.json)`` of every trial of a job, by trial name."""
    out = []
    for d in sorted(p for p in job_dir.iterdir() if p.is_dir()):
        f = d / "result.json"
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
            if isinstance(data, dict) and "trial_name" in data:
                out.append((d, data))
    return out


def job_run(store: EventStore, name: str) -> Run:
    """The dressage run of a Harbor job (created when the job's first trial is recorded)."""
    if name in {r.name for r in store.runs.list()}:
        return store.runs.get(name)
    return store.runs.create(name, {"harbor_job": name})


def record_trial(
    store: EventStore, run: Run, trial_dir: Path, result: dict[str, Any], attempt: int, key: str | None = None
) -> bool:
    """Record one trial (its ``result.json`` parsed) as a session; True when it finished (its reward
    a number, or NULL when no rule picks one of its several rewards)."""
    trial = str(result["trial_name"])
    session = next((s for s in store.sessions.list(run) if s.info.get("trial_name") == trial), None)
    if session is None:
        agent = (result.get("agent_info") or {}).get("name") or "harbor"
        session = store.sessions.open(
            run,
            attempt=attempt,
            agent=f"harbor:{agent}",
            sandbox="harbor",
            info={"trial_name": trial, "task": result.get("task_name")},
        )
    rewards = (result.get("verifier_result") or {}).get("rewards")
    exc = result.get("exception_info")
    details = {
        "kind": "harbor",
        "trial_name": trial,
        "task": result.get("task_name"),
        "task_checksum": result.get("task_checksum"),
        "rewards": rewards,
        "exception": exc,
        "attempt": attempt,
    }
    error = None
    value = None
    unchosen: str | None = None
    if exc:
        error = f"{exc.get('exception_type')}: {exc.get('exception_message')}"
    elif not rewards:
        error = "the trial has no verifier rewards"
    else:
        try:
            value = select_reward({k: float(v) for k, v in rewards.items()}, key, None)
        except NoScalarRewardError as e:
            unchosen = details["no_scalar_reward"] = str(e)
        except RewardError as e:
            error = str(e)
    if session.status == "running":
        if value is not None or unchosen is not None:
            store.events.append(
                run,
                "reward",
                {"reward": value, "details": details},
                key=deterministic_key(run.name, session.id, "reward"),
                session_id=session.id,
            )
            info = {**session.info, "no_scalar_reward": unchosen} if unchosen is not None else {}
            store.sessions.finalize(
                session.id, "finished", reward=value, finish_reason="harbor_trial", info=info
            )
        else:
            store.sessions.finalize(session.id, "failed", finish_reason="harbor_trial", error=error)
    result_json = trial_dir / "result.json"
    data = result_json.read_bytes() if result_json.is_file() else json.dumps(result).encode()
    store.artifacts.put(run, data, name="result.json", media_type="application/json", session_id=session.id)
    stdout = trial_dir / "verifier" / "test-stdout.txt"
    if stdout.is_file():
        store.artifacts.put(
            run, stdout.read_bytes(), name="test-stdout.txt", media_type="text/plain", session_id=session.id
        )
    return value is not None or unchosen is not None


def record_job(
    store: EventStore, job_dir: Path, run_name: str | None = None, key: str | None = None
) -> dict[str, int]:
    """Record every trial of ``job_dir`` (see the module docstring); counts of finished/failed sessions."""
    run = job_run(store, run_name or f"harbor-{job_dir.name}")
    counts = {"finished": 0, "failed": 0}
    results = sorted(trial_results(job_dir), key=lambda tr: (str(tr[1].get("started_at") or ""), tr[0].name))
    attempts: dict[str, int] = {}
    for trial_dir, result in results:
        task = str(result.get("task_name"))
        attempts[task] = attempts.get(task, 0) + 1
        finished = record_trial(store, run, trial_dir, result, attempts[task], key)
        counts["finished" if finished else "failed"] += 1
    return counts


def add_run_arguments(parser: argparse.ArgumentParser, default_run: str) -> None:
    """The ``--run NAME`` and ``--key KEY`` options of this command and of :mod:`dressage.harbor.job`
    (``default_run`` names the run used without ``--run``, for the help)."""
    parser.add_argument("--run", default=None, help=f"The dressage run (default: {default_run}).")
    parser.add_argument("--key", default=None, help="The reward.json key that is the session's reward.")


def record_and_report(
    record: Callable[[EventStore], dict[str, int]], reported: tuple[type[Exception], ...] = ()
) -> int:
    """The end of this command and of :mod:`dressage.harbor.job`: open the configured store, run
    ``record`` on it (it returns the counts of ``finished`` and ``failed`` sessions), close the store
    whatever happens and print the counts; the exit status, 0. An error of a ``reported`` type raised
    by ``record`` is printed as ``error: ...`` instead, with status 1; any other error propagates."""
    store = EventStore.open(settings=load_settings())
    try:
        counts = record(store)
    except reported as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"recorded {counts['finished']} finished and {counts['failed']} failed trials")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m dressage.harbor.record JOB_DIR [--run NAME] [--key KEY]``."""
    p = argparse.ArgumentParser(prog="python -m dressage.harbor.record", description=__doc__.split("\n")[0])
    p.add_argument("job_dir", type=Path, help="A Harbor job directory (holds the trials' directories).")
    add_run_arguments(p, "harbor-<job directory name>")
    args = p.parse_args(argv)
    if not args.job_dir.is_dir():
        print(f"error: {args.job_dir} is not a directory", file=sys.stderr)
        return 2
    return record_and_report(
        lambda store: record_job(store, args.job_dir, args.run, args.key), (DressageError,)
    )


if __name__ == "__main__":
    raise SystemExit(main())
