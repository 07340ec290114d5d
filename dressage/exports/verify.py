"""``verify-export``: re-hash every file of an export against its manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dressage.errors import ExportVerificationError
from dressage.exports.export import MANIFEST, sha256_file
from dressage.exports.tables import FORMAT, FORMAT_VERSION


def read_manifest(export_dir: Path | str) -> dict[str, Any]:
    """The manifest of an export of this format version; a one-line error otherwise."""
    root = Path(export_dir)
    try:
        manifest: dict[str, object] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportVerificationError(
            f"{root} has no readable {MANIFEST} ({e}); it is not an export or the export was interrupted"
        ) from e
    if manifest.get("format") != FORMAT:
        raise ExportVerificationError(f"{root / MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ExportVerificationError(
            f"{root / MANIFEST} has format_version {manifest.get('format_version')!r}; this Dressage "
            f"reads {FORMAT_VERSION} (export the run again with this version)"
        )
    return manifest


def verify_export(export_dir: Path | str) -> dict[str, Any]:
    """Re-hash every file of an export against its manifest; return the manifest when all match.

    Raises :class:`ExportVerificationError` listing missing, altered and unexpected files.
    """
    root = Path(export_dir)
    manifest = read_manifest(root)
    expected: dict[str, dict[str, object]] = manifest.get("files", {})
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {MANIFEST}
    problems = [f"missing {name}" for name in sorted(set(expected) - present)]
    problems += [f"unexpected {name}" for name in sorted(present - set(expected))]
    for name in sorted(set(expected) & present):
        if sha256_file(root / name) != expected[name]["sha256"]:
            problems.append(f"altered {name}")
    if problems:
        shown = ", ".join(problems[:10]) + (f" and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise ExportVerificationError(f"export {root} does not match its manifest: {shown}")
    return manifest
