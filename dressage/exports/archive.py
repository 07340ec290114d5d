"""``dressage-worker archive RUN --to DIR``: export, verify, then drop, stopping at the first failure.

The run is dropped only when the export verifies against its manifest, holds every turn and event
the log holds, and no event was appended while it was written (a run still being written to is
refused: its export would be a prefix). Nothing is dropped that was not verified.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dressage.errors import StoreError
from dressage.exports.export import Progress, export_run
from dressage.exports.verify import verify_export
from dressage.store.event_store import EventStore


def archive_run(
    store: EventStore, run: str, to: Path | str, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Export ``run`` to ``to``, verify the files, check the counts, drop the run; return the manifest."""
    before = store.runs.summary(run)
    export_run(store, run, to, progress=progress)
    manifest = verify_export(to)
    after = store.runs.summary(run)
    counts = manifest["counts"]
    if after.last_position != before.last_position or manifest["last_position"] != after.last_position:
        raise StoreError(
            f"run {run!r} was written to during the export (last position {before.last_position} -> "
            f"{after.last_position}); it was not dropped: archive a run no worker is writing to"
        )
    if counts["turns"] != after.turns or counts["events"] != after.last_position:
        raise StoreError(
            f"the export of run {run!r} holds {counts['turns']} turns and {counts['events']} events, the "
            f"log {after.turns} and {after.last_position}; the run was not dropped"
        )
    store.runs.drop(run)
    return manifest
