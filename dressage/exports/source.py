"""``train --from-export DIR``: an export directory as a run to train on.

The trainer reads runs from the log, so an export is imported first, under a name derived from
its manifest (``<run>@export-<first 12 hex of the manifest's sha256>``): training on the same
directory again (or replaying its steps) finds that run already there and trains on it, and two
different exports of one run never share a name. The files are always verified against the
manifest first, so an altered directory is refused even when its run was imported before.
"""

from __future__ import annotations

from pathlib import Path

from dressage.errors import StoreError
from dressage.exports.export import MANIFEST, sha256_file
from dressage.exports.importer import import_run
from dressage.exports.verify import verify_export
from dressage.store.event_store import EventStore


def export_run_name(export_dir: Path | str) -> str:
    """The run name an export directory trains under (see the module docstring)."""
    root = Path(export_dir)
    manifest = verify_export(root)
    return f"{manifest['run']}@export-{sha256_file(root / MANIFEST)[:12]}"


def run_from_export(store: EventStore, export_dir: Path | str) -> str:
    """Verify ``export_dir``, import it under its derived name unless the log has it; the name."""
    name = export_run_name(export_dir)
    manifest = verify_export(export_dir)
    existing = next((r for r in store.runs.list() if r.name == name), None)
    if existing is None:
        import_run(store, export_dir, as_run=name)
    elif existing.config_hash != manifest["config_hash"]:
        raise StoreError(
            f"run {name!r} in this log is not the import of {export_dir} (its config differs); "
            "drop it or import the directory under another name with `import --as`"
        )
    return name
