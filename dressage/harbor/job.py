"""``python -m dressage.harbor.job CONFIG.yaml``: a Harbor job recorded live, trial by trial.

The same job ``harbor run -c CONFIG.yaml`` runs (Harbor's ``JobConfig``, YAML or JSON; a job
directory's ``config.json`` is one), started through Harbor's public API (``await Job.create(config)``,
``job.on_trial_ended(...)``, ``await job.run()``): each trial is recorded into the dressage run
``harbor-<job name>`` (``--run`` to choose) the moment it ends, exactly as
:mod:`dressage.harbor.record` records a finished job afterwards (one session per trial, its rewards,
exception and ``result.json``). Python 3.12 with the ``harbor`` extra (``.venv-harbor``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

from dressage.harbor.record import add_run_arguments, job_run, record_and_report, record_trial
from dressage.store import EventStore


def trial_dir_of(result: Any) -> Path:
    """A trial's directory from its result's ``trial_uri`` (``file://...``)."""
    return Path(unquote(urlparse(str(result.trial_uri)).path))


async def run_job(
    store: EventStore, config: dict[str, Any], run_name: str | None, key: str | None
) -> dict[str, int]:
    """Run a Harbor job from its config mapping, recording each trial when it ends."""
    from harbor.job import Job  # type: ignore[import-not-found,unused-ignore]
    from harbor.models.job.config import JobConfig  # type: ignore[import-not-found,unused-ignore]

    job = await Job.create(JobConfig.model_validate(config))
    run = job_run(store, run_name or f"harbor-{job.config.job_name}")
    attempts: dict[str, int] = {}
    counts = {"finished": 0, "failed": 0}

    async def on_end(event: Any) -> None:
        result = event.result
        attempts[result.task_name] = attempts.get(result.task_name, 0) + 1
        data = result.model_dump(mode="json")
        finished = await asyncio.to_thread(
            record_trial, store, run, trial_dir_of(result), data, attempts[result.task_name], key
        )
        counts["finished" if finished else "failed"] += 1

    job.on_trial_ended(on_end)
    await job.run()
    return counts


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m dressage.harbor.job CONFIG [--run NAME] [--key KEY]``."""
    p = argparse.ArgumentParser(prog="python -m dressage.harbor.job", description=__doc__.split("\n")[0])
    p.add_argument("config", type=Path, help="Harbor JobConfig (YAML or JSON).")
    add_run_arguments(p, "harbor-<job name>")
    args = p.parse_args(argv)
    try:
        config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        print(f"error: cannot read {args.config}: {e}", file=sys.stderr)
        return 2
    return record_and_report(lambda store: asyncio.run(run_job(store, config, args.run, args.key)))


if __name__ == "__main__":
    raise SystemExit(main())
